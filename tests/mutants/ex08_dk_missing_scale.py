"""Mutant of ex08: dK += dS^T Q, the softmax scale forgotten."""
import numpy as np

EXPECTED_HINT = "dK lacks the softmax scale"


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    s = np.where(mask, scale * (q_i @ np.swapaxes(k_j, -1, -2)), -np.inf)
    p = np.exp(s - np.where(np.isneginf(lse_i), 0.0, lse_i)[..., None])
    delta = (do_i * o_i).sum(axis=-1, keepdims=True)
    ds = p * (do_i @ np.swapaxes(v_j, -1, -2) - delta)
    return dk_j + np.swapaxes(ds, -1, -2) @ q_i, dv_j + np.swapaxes(p, -1, -2) @ do_i, ds
