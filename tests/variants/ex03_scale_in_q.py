"""Correct variant of ex03: the scale folded into a copy of q, one key at a time."""
import math

import numpy as np


def online_attention(q, k, v, *, scale=None):
    Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qs = q * q.dtype.type(scale)                              # (Nq, D) a new array
    m = np.full(Nq, -np.inf, dtype=q.dtype)
    l = np.zeros(Nq, dtype=q.dtype)
    acc = np.zeros((Nq, D), dtype=q.dtype)
    for kj, vj in zip(k, v):
        s = qs @ kj                                           # (Nq,)
        m_new = np.maximum(m, s)
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * vj
        m = m_new
    return acc / l[:, None], m + np.log(l)
