"""Mutant of ex03: reads each key once, in order, but keeps every score and value and runs the two-
pass attention after the loop: an O(Nq Nk) buffer, not the online algorithm."""
import math

import numpy as np

EXPECTED_HINT = "memory grows with the number of keys"


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
    scores, values = [], []
    for j in range(Nk):                               # one read of each key, in order
        scores.append((q @ k[j]) * scale)
        values.append(v[j])
    S = np.stack(scores, axis=1)                      # (Nq, Nk): the whole score matrix after all
    V = np.stack(values)
    m = S.max(axis=1)
    P = np.exp(S - m[:, None])
    l = P.sum(axis=1)
    out = (P @ V) / l[:, None]
    lse = m + np.log(l)
    return out, lse
