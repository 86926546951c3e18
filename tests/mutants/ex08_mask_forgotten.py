"""Mutant of ex08: the mask is ignored in the backward, so P is not 0 above the causal diagonal
(or past Nk)."""
import numpy as np

EXPECTED_HINT = "P is not 0 where the mask is False"


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    s = scale * (q_i @ np.swapaxes(k_j, -1, -2))
    p = np.exp(s - np.where(np.isneginf(lse_i), 0.0, lse_i)[..., None])
    delta = (do_i * o_i).sum(axis=-1, keepdims=True)
    ds = p * (do_i @ np.swapaxes(v_j, -1, -2) - delta)
    return (dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i),
            dv_j + np.swapaxes(p, -1, -2) @ do_i, ds)
