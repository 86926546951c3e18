"""Mutant of ex10: weights exp(lse_s - max) that are never divided by their sum."""
import numpy as np

EXPECTED_HINT = "do not sum to 1"


def combine_splits(out_parts, lse_parts):
    m = lse_parts.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    w = np.exp(lse_parts - m)
    total = w.sum(axis=-1)
    empty = total == 0.0
    out = (w[..., None] * out_parts).sum(axis=-2)
    lse = np.where(empty, -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, total)))
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
