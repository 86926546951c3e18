"""Correct variant of ex01: log-softmax first (lse = m + log(sum(exp(x - m)))), then exp(x - lse)."""
import numpy as np


def safe_softmax(x):
    """Softmax over the last axis of ``x``, stable for any finite input.

    x: NumPy array (..., N) of float32 or float64, N >= 1; any number of leading axes.
    Returns an array of the same shape and dtype whose rows (last axis) sum to 1.
    Does not modify ``x``.
    """
    m = x.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return np.exp(x - lse)
