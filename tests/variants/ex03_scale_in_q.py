"""Correct variant of ex03: the scale folded into a copy of q, one key at a time; the merge in its
sigmoid form; the parts of split_attention merged from the last to the first."""
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


def merge_states(out_a, lse_a, out_b, lse_b):
    """The sigmoid form: w_a = 1 / (1 + e^(lse_b - lse_a)), lse = max + log1p(e^-|a - b|)."""
    both_empty = np.isneginf(lse_a) & np.isneginf(lse_b)
    a = np.where(both_empty, 0, lse_a)                       # (...) both empty: any equal pair
    b = np.where(both_empty, 0, lse_b)
    w_a = 1 / (1 + np.exp(b - a))                             # exp may be inf: w_a = 0
    w_b = 1 / (1 + np.exp(a - b))
    lse = np.maximum(a, b) + np.log1p(np.exp(-np.abs(a - b)))
    out = w_a[..., None] * out_a + w_b[..., None] * out_b
    return np.where(both_empty[..., None], 0, out), np.where(both_empty, -np.inf, lse)


def split_attention(q, k, v, cuts, *, scale=None):
    """The parts from the last to the first (another loop order)."""
    out = np.zeros_like(q)
    lse = np.full(q.shape[0], -np.inf, dtype=q.dtype)
    for i in reversed(range(len(cuts) - 1)):
        a, b = cuts[i], cuts[i + 1]
        if a < b:
            out, lse = merge_states(*online_attention(q, k[a:b], v[a:b], scale=scale), out, lse)
    return out, lse
