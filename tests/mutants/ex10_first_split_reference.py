"""Mutant of ex10: subtracts the first split's lse (any reference cancels on paper, the weights
being normalised) instead of the largest: right while no split lies more than ~88 (float32) or
~709 (float64) above the first, else exp(lse_s - lse_0) overflows to inf and out is NaN."""
import numpy as np

EXPECTED_HINT = "the largest lse_s of the row"


def combine_splits(out_parts, lse_parts):
    m = lse_parts[..., :1]                                    # the first split's lse
    m = np.where(np.isneginf(m), lse_parts.max(axis=-1, keepdims=True), m)
    m = np.where(np.isneginf(m), 0.0, m)
    w = np.exp(lse_parts - m)
    total = w.sum(axis=-1)
    empty = total == 0.0
    out = (w[..., None] * out_parts).sum(axis=-2) / np.where(empty, 1.0, total)[..., None]
    lse = np.where(empty, -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, total)))
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
