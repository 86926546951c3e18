"""Correct variant of ex08, as flashlib's backward kernel does it: scale folded into a copy of q,
base-2 scores and lse, D first."""
import math

import numpy as np


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    t = q_i.dtype.type
    qs = q_i * t(scale)                                          # (..., Bq, D)
    s2 = (qs @ np.swapaxes(k_j, -1, -2)) * t(math.log2(math.e))  # (..., Bq, Bk) base 2
    s2 = np.where(mask, s2, -np.inf)
    lse2 = np.where(np.isneginf(lse_i), 0, lse_i * t(math.log2(math.e))).astype(lse_i.dtype)
    p = np.exp2(s2 - lse2[..., None])
    delta = np.einsum("...d,...d->...", do_i, o_i)               # (..., Bq)
    ds = p * (do_i @ np.swapaxes(v_j, -1, -2) - delta[..., None])
    return dk_j + np.swapaxes(ds, -1, -2) @ qs, dv_j + np.swapaxes(p, -1, -2) @ do_i, ds
