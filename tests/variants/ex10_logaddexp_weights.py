"""Correct variant of ex10: flash-decoding's combine: lse = np.logaddexp.reduce over the splits,
weights exp(lse_s - lse)."""
import numpy as np


def combine_splits(out_parts, lse_parts):
    """Merge the S partial attention results of every query row.

    out_parts: (..., S, D), each split's normalised output; lse_parts: (..., S), each split's
    natural-log lse, -inf for an empty split (whose out_parts row is 0). float32 or float64
    NumPy arrays (one dtype); any leading dims (e.g. batch, heads, new tokens).
    Returns (out, lse): out (..., D) and lse (...), in the inputs' dtype.
    """
    lse = np.logaddexp.reduce(lse_parts, axis=-1)             # (...) -inf when all empty
    safe = np.where(np.isneginf(lse), 0.0, lse)
    w = np.exp(lse_parts - safe[..., None])                   # each split's share of the softmax
    out = np.einsum("...s,...sd->...d", w, out_parts)
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
