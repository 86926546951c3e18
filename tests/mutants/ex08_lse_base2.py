"""Mutant of ex08: base-2 scores as in the Triton kernel, but the natural-log lse subtracted as
if it were base 2 (P = exp2(S log2 e - lse))."""
import math

import numpy as np

EXPECTED_HINT = "lse is a natural log"


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    s2 = np.where(mask, scale * math.log2(math.e) * (q_i @ np.swapaxes(k_j, -1, -2)), -np.inf)
    p = np.exp2(s2 - np.where(np.isneginf(lse_i), 0.0, lse_i)[..., None])
    delta = (do_i * o_i).sum(axis=-1, keepdims=True)
    ds = p * (do_i @ np.swapaxes(v_j, -1, -2) - delta)
    return (dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i),
            dv_j + np.swapaxes(p, -1, -2) @ do_i, ds)
