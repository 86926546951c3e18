"""Correct variant of ex10: the splits merged one at a time, as a running (out, lse) state."""
import numpy as np


def combine_splits(out_parts, lse_parts):
    out = np.zeros(out_parts.shape[:-2] + out_parts.shape[-1:], dtype=out_parts.dtype)
    lse = np.full(lse_parts.shape[:-1], -np.inf, dtype=lse_parts.dtype)
    for s in range(lse_parts.shape[-1]):
        new = lse_parts[..., s]
        m = np.maximum(lse, new)
        ref = np.where(np.isneginf(m), 0, m).astype(lse.dtype)
        a, b = np.exp(lse - ref), np.exp(new - ref)
        total = a + b
        safe = np.where(total > 0, total, 1).astype(total.dtype)
        out = (a / safe)[..., None] * out + (b / safe)[..., None] * out_parts[..., s, :]
        lse = np.where(total > 0, ref + np.log(safe), -np.inf).astype(lse.dtype)
    return out, lse
