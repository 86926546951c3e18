"""Mutant of ex10: the reference max is taken over the whole array (``lse_parts.max()``, no axis)
instead of per row: right while every row's lse lie within exp's range of the largest one
anywhere, but a row whose splits all lie more than ~88 (float32) below another row's max has
every exp(lse_s - m) underflow to 0 and comes out empty."""
import numpy as np

EXPECTED_HINT = "its own max"


def combine_splits(out_parts, lse_parts):
    finite = lse_parts[np.isfinite(lse_parts)]
    m = finite.max() if finite.size else 0.0                  # one max for every row
    w = np.exp(lse_parts - m)
    total = w.sum(axis=-1)
    empty = total == 0.0
    out = (w[..., None] * out_parts).sum(axis=-2) / np.where(empty, 1.0, total)[..., None]
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, total)))
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
