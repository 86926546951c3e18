"""Mutant of ex03: a first loop over the keys for the max, a second one for l and acc: two passes."""
import math

import numpy as np

EXPECTED_HINT = "one pass"


def online_attention(q, k, v, *, scale=None):
    Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m = np.full(Nq, -np.inf, dtype=q.dtype)
    for j in range(k.shape[0]):
        m = np.maximum(m, (q @ k[j]) * scale)
    l = np.zeros(Nq, dtype=q.dtype)
    acc = np.zeros((Nq, D), dtype=q.dtype)
    for j in range(k.shape[0]):
        p = np.exp((q @ k[j]) * scale - m)
        l = l + p
        acc = acc + p[:, None] * v[j]
    return acc / l[:, None], m + np.log(l)
