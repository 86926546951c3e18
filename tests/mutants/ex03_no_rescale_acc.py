"""Mutant of ex03: rescales l but forgets to rescale the output accumulator."""
import math

import numpy as np

EXPECTED_HINT = "did you rescale acc"


def online_attention(q, k, v, *, scale=None):
    Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m = np.full(Nq, -np.inf, dtype=q.dtype)
    l = np.zeros(Nq, dtype=q.dtype)
    acc = np.zeros((Nq, D), dtype=q.dtype)
    for j in range(k.shape[0]):
        s = (q @ k[j]) * scale
        m_new = np.maximum(m, s)
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * alpha + p
        acc = acc + p[:, None] * v[j]
        m = m_new
    return acc / l[:, None], m + np.log(l)
