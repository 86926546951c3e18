"""Correct variant of ex03, as flashlib's kernels do it: scale * log2(e) folded into a copy of q,
base-2 exponents, blocks of 16 keys, lse converted back to natural log at the end; the merge in
base 2; the parts of split_attention merged as a tree."""
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


def merge_states(out_a, lse_a, out_b, lse_b):
    """Base 2, as flashlib's kernels: exp2 of the differences times log2(e), log2 back."""
    c = lse_a.dtype.type(math.log2(math.e))
    m = np.maximum(lse_a, lse_b)
    m = np.where(m == -np.inf, 0, m)
    w_a, w_b = np.exp2((lse_a - m) * c), np.exp2((lse_b - m) * c)   # subtract first: exact-ish
    total = w_a + w_b
    lse = np.where(total > 0, m + np.log2(np.where(total > 0, total, 1)) / c, -np.inf)
    out = (out_a * w_a[..., None] + out_b * w_b[..., None]) / np.maximum(total, 1e-30)[..., None]
    return out, lse


def split_attention(q, k, v, cuts, *, scale=None):
    """The parts' results merged as a tree, neighbours first, as parallel programs would."""
    level = [online_attention(q, k[a:b], v[a:b], scale=scale)
             for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    if not level:
        return np.zeros_like(q), np.full(q.shape[0], -np.inf, dtype=q.dtype)
    while len(level) > 1:
        level = [merge_states(*level[i], *level[i + 1]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return level[0]
