"""Mutant of ex10: subtracts the max without a guard, so a row of empty splits gives NaN."""
import numpy as np

EXPECTED_HINT = "not NaN"


def combine_splits(out_parts, lse_parts):
    m = lse_parts.max(axis=-1, keepdims=True)
    w = np.exp(lse_parts - m)
    total = w.sum(axis=-1)
    out = (w[..., None] * out_parts).sum(axis=-2) / total[..., None]
    lse = m[..., 0] + np.log(total)
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
