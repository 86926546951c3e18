"""Mutant of ex03: accumulates in float64 and returns float64 for float32 inputs (the docstring
promises q's dtype)."""
import math

import numpy as np

EXPECTED_HINT = "dtype"


def online_attention(q, k, v, *, scale=None):
    Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m = np.full(Nq, -np.inf)
    l = np.zeros(Nq)
    acc = np.zeros((Nq, D))
    for j in range(k.shape[0]):
        s = (q @ k[j]).astype(np.float64) * scale
        m_new = np.maximum(m, s)
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v[j]
        m = m_new
    return acc / l[:, None], m + np.log(l)
