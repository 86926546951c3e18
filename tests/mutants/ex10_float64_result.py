"""Mutant of ex10: merges in float64 and returns float64 for float32 inputs (the docstring
promises the inputs' dtype)."""
import numpy as np

EXPECTED_HINT = "dtype"


def combine_splits(out_parts, lse_parts):
    o, l = out_parts.astype(np.float64), lse_parts.astype(np.float64)
    m = l.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    w = np.exp(l - m)
    total = w.sum(axis=-1)
    empty = total == 0.0
    out = (w[..., None] * o).sum(axis=-2) / np.where(empty, 1.0, total)[..., None]
    lse = np.where(empty, -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, total)))
    return out, lse
