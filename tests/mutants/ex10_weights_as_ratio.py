"""Mutant of ex10: weights exp(lse_s) / exp(lse): equal on paper, inf / inf for lse in the
thousands."""
import numpy as np

EXPECTED_HINT = "overflows"


def combine_splits(out_parts, lse_parts):
    lse = np.logaddexp.reduce(lse_parts, axis=-1)
    finite = np.isfinite(lse)
    w = np.exp(lse_parts) / np.exp(np.where(finite, lse, 0.0))[..., None]
    out = (w[..., None] * out_parts).sum(axis=-2)
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
