"""Mutant of ex08: P = exp(S) / exp(lse): equal on paper, inf / inf past exp's range."""
import numpy as np

EXPECTED_HINT = "never exp(S) / exp(lse)"


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    s = scale * (q_i @ np.swapaxes(k_j, -1, -2))
    s = np.where(mask, s, -np.inf)
    lse_safe = np.where(np.isneginf(lse_i), np.inf, lse_i)
    p = np.exp(s) / np.exp(lse_safe)[..., None]
    delta = (do_i * o_i).sum(axis=-1)
    dv_j = dv_j + np.swapaxes(p, -1, -2) @ do_i
    ds = p * (do_i @ np.swapaxes(v_j, -1, -2) - delta[..., None])
    return dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i), dv_j, ds
