"""Mutant of ex08: the mask applied after exp (P = exp(S - lse) * mask): masked scores far above
lse overflow, and inf * 0 is NaN."""
import numpy as np

EXPECTED_HINT = "before exp"


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    s = scale * (q_i @ np.swapaxes(k_j, -1, -2))
    lse_safe = np.where(np.isneginf(lse_i), 0.0, lse_i)
    p = np.exp(s - lse_safe[..., None]) * mask
    delta = (do_i * o_i).sum(axis=-1)
    dv_j = dv_j + np.swapaxes(p, -1, -2) @ do_i
    ds = p * (do_i @ np.swapaxes(v_j, -1, -2) - delta[..., None])
    return dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i), dv_j, ds
