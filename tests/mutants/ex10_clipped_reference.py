"""Mutant of ex10: -1e4 as the floor of the reference max instead of handling -inf: rows whose
splits all have lse below -1e4 come out empty."""
import numpy as np

EXPECTED_HINT = "-1e4"


def combine_splits(out_parts, lse_parts):
    m = np.maximum(lse_parts.max(axis=-1, keepdims=True), -1e4)
    w = np.exp(lse_parts - m)
    total = w.sum(axis=-1)
    empty = total == 0.0
    out = (w[..., None] * out_parts).sum(axis=-2) / np.where(empty, 1.0, total)[..., None]
    lse = np.where(empty, -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, total)))
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
