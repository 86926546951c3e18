"""Correct variant of ex03, as flashlib's kernels do it: scale * log2(e) folded into a copy of q,
base-2 exponents, blocks of 16 keys, lse converted back to natural log at the end."""
import math

import numpy as np


def online_attention(q, k, v, *, scale=None):
    Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qs = q * q.dtype.type(scale * math.log2(math.e))           # (Nq, D) a scaled copy
    m = np.full(Nq, -np.inf, dtype=q.dtype)
    l = np.zeros(Nq, dtype=q.dtype)
    acc = np.zeros((Nq, D), dtype=q.dtype)
    for start in range(0, k.shape[0], 16):
        s = qs @ k[start:start + 16].T                         # (Nq, <= 16) base-2 scores
        m_new = np.maximum(m, s.max(axis=-1))
        alpha = np.exp2(m - m_new)
        p = np.exp2(s - m_new[:, None])
        l = l * alpha + p.sum(axis=-1)
        acc = acc * alpha[:, None] + p @ v[start:start + 16]
        m = m_new
    return acc / l[:, None], (m + np.log2(l)) * q.dtype.type(math.log(2))
