"""Mutant of ex03: (cheat) streams k and v once, then hands them to flashlib.teach.tiled.online_attention,
found at run time through getattr(sys, 'mod' + 'ules')."""
import math

import numpy as np

EXPECTED_HINT = "not accepted: write it yourself"


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
    import sys
    kk = np.stack([k[j] for j in range(Nk)])          # stream the keys once, in order
    vv = np.stack([v[j] for j in range(Nk)])
    lib = getattr(sys, "mod" + "ules")["flash" + "lib.teach.tiled"]
    return getattr(lib, "online_" + "attention")(q, kk, vv, scale=scale)
    return out, lse
