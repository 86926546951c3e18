"""Mutant of ex08: D = rowsum(P * dP) of this tile instead of rowsum(dO * O) (right only when
the tile holds every key of the row)."""
import numpy as np

EXPECTED_HINT = "rowsum(dO * O), not rowsum(P * dP)"


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    s = np.where(mask, scale * (q_i @ np.swapaxes(k_j, -1, -2)), -np.inf)
    p = np.exp(s - np.where(np.isneginf(lse_i), 0.0, lse_i)[..., None])
    dp = do_i @ np.swapaxes(v_j, -1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return (dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i),
            dv_j + np.swapaxes(p, -1, -2) @ do_i, ds)
