"""Mutant of ex03: divides by l at every key, then keeps accumulating as if unnormalised."""
import math

import numpy as np

EXPECTED_HINT = "once, at the end"


def online_attention(q, k, v, *, scale=None):
    Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m = np.full(Nq, -np.inf, dtype=q.dtype)
    l = np.zeros(Nq, dtype=q.dtype)
    out = np.zeros((Nq, D), dtype=q.dtype)
    for j in range(k.shape[0]):
        s = (q @ k[j]) * scale
        m_new = np.maximum(m, s)
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * alpha + p
        out = (out * alpha[:, None] + p[:, None] * v[j]) / l[:, None]
        m = m_new
    return out, m + np.log(l)
