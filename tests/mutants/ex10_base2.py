"""Mutant of ex10: treats the natural-log lse_s as base-2 (exp2 and log2, as inside the kernels)."""
import numpy as np

EXPECTED_HINT = "natural log"


def combine_splits(out_parts, lse_parts):
    m = lse_parts.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    w = np.exp2(lse_parts - m)
    total = w.sum(axis=-1)
    empty = total == 0.0
    out = (w[..., None] * out_parts).sum(axis=-2) / np.where(empty, 1.0, total)[..., None]
    lse = np.where(empty, -np.inf, m[..., 0] + np.log2(np.where(empty, 1.0, total)))
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
