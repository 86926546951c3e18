"""Mutant of ex10: averages the splits' outputs, ignoring how much of the softmax each one holds."""
import numpy as np

EXPECTED_HINT = "plain average"


def combine_splits(out_parts, lse_parts):
    m = lse_parts.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    total = np.exp(lse_parts - m).sum(axis=-1)
    empty = total == 0.0
    lse = np.where(empty, -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, total)))
    return out_parts.mean(axis=-2).astype(out_parts.dtype), lse.astype(lse_parts.dtype)
