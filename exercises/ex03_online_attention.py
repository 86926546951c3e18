"""Exercise 03 (lesson 03): attention in one pass over the keys.

Attention for one query row q: scores s_j = scale * (q . k_j), weights p_j = softmax(s)_j,
output o = sum_j p_j v_j. The online normaliser of lesson 02 extends to the output: keep per
query row the running max m, the running sum l = sum_j exp(s_j - m) and the UNNORMALISED output
acc = sum_j exp(s_j - m) v_j over the keys seen so far. For each new key j:

    m_new = max(m, s_j)
    alpha = exp(m - m_new)                     # rescales everything computed relative to m
    l     = l * alpha + exp(s_j - m_new)
    acc   = acc * alpha + exp(s_j - m_new) * v_j
    m     = m_new

and only after the last key: out = acc / l (normalise once), and the log-sum-exp of the scores
lse = m + log(l), which lesson 03 uses to merge partial outputs (FlashAttention-2 saves it for
the backward pass). Compare ``flashlib.teach.tiled.online_attention``.

Write the loop below, vectorised over the query rows; then run ``flashlib check ex03``.
"""
import math

import numpy as np


def online_attention(q, k, v, *, scale=None):
    """Softmax attention of every query row over all keys, in one pass over the keys.

    q: (Nq, D); k, v: (Nk, D), Nk >= 1; float32 or float64 NumPy arrays (one dtype).
    scale: multiplies the scores q . k_j; 1/sqrt(D) when None.
    Returns (out, lse): out (Nq, D) = softmax(scale * q @ k.T) @ v, and lse (Nq,) = the
    natural-log log-sum-exp of each row of scale * q @ k.T; both in q's dtype.
    """
    Nq, D = q.shape
    Nk = k.shape[0]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m = np.full(Nq, -np.inf, dtype=q.dtype)     # (Nq,) running max of the scores
    l = np.zeros(Nq, dtype=q.dtype)             # (Nq,) running sum of exp(s - m)
    acc = np.zeros((Nq, D), dtype=q.dtype)      # (Nq, D) running unnormalised output
    raise NotImplementedError('ex03: your code goes here, then run `flashlib check ex03`')
    return out, lse
