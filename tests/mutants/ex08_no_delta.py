"""Mutant of ex08: dS = P * dP, softmax's backward without the D term."""
import numpy as np

EXPECTED_HINT = "you left out D"


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    s = np.where(mask, scale * (q_i @ np.swapaxes(k_j, -1, -2)), -np.inf)
    p = np.exp(s - np.where(np.isneginf(lse_i), 0.0, lse_i)[..., None])
    ds = p * (do_i @ np.swapaxes(v_j, -1, -2))
    return (dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i),
            dv_j + np.swapaxes(p, -1, -2) @ do_i, ds)
