"""Mutant of ex03: folds the scale into q in place (q *= scale), changing the caller's q."""
import math

import numpy as np

EXPECTED_HINT = "in place"


def online_attention(q, k, v, *, scale=None):
    Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q *= q.dtype.type(scale)
    m = np.full(Nq, -np.inf, dtype=q.dtype)
    l = np.zeros(Nq, dtype=q.dtype)
    acc = np.zeros((Nq, D), dtype=q.dtype)
    for j in range(k.shape[0]):
        s = q @ k[j]
        m_new = np.maximum(m, s)
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v[j]
        m = m_new
    return acc / l[:, None], m + np.log(l)
