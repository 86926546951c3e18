"""Mutant of ex08: P = exp(S - lse) without a guard, NaN on rows whose lse is -inf."""
import numpy as np

EXPECTED_HINT = "exp(-inf - (-inf)) is NaN"


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    s = np.where(mask, scale * (q_i @ np.swapaxes(k_j, -1, -2)), -np.inf)
    p = np.exp(s - lse_i[..., None])
    delta = (do_i * o_i).sum(axis=-1, keepdims=True)
    ds = p * (do_i @ np.swapaxes(v_j, -1, -2) - delta)
    return (dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i),
            dv_j + np.swapaxes(p, -1, -2) @ do_i, ds)
