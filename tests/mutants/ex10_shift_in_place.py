"""Mutant of ex10: subtracts the max from lse_parts in place, changing the caller's array."""
import numpy as np

EXPECTED_HINT = "in place"


def combine_splits(out_parts, lse_parts):
    m = lse_parts.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    lse_parts -= m
    w = np.exp(lse_parts)
    total = w.sum(axis=-1)
    empty = total == 0.0
    out = (w[..., None] * out_parts).sum(axis=-2) / np.where(empty, 1.0, total)[..., None]
    lse = np.where(empty, -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, total)))
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
