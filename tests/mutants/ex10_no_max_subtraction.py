"""Mutant of ex10: exponentiates the lse_s directly, which overflows once they pass exp's range."""
import numpy as np

EXPECTED_HINT = "subtract the running max"


def combine_splits(out_parts, lse_parts):
    w = np.exp(lse_parts)
    total = w.sum(axis=-1)
    empty = total == 0.0
    out = (w[..., None] * out_parts).sum(axis=-2) / np.where(empty, 1.0, total)[..., None]
    lse = np.where(empty, -np.inf, np.log(np.where(empty, 1.0, total)))
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
