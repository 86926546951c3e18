"""Mutant of ex02: reads each block once, in order (so the read check passes), but keeps them all and
runs the two-pass computation after the loop: O(N) memory, not the online algorithm."""
import numpy as np

EXPECTED_HINT = "memory grows with the number of columns"


def online_normalizer(x, block_size):
    """One pass over the last axis of ``x`` in blocks: the row max and the normaliser.

    x: NumPy array (..., N) of float32 or float64, N >= 1. block_size: int >= 1 (need not
    divide N; it may exceed N).
    Returns (m, d), each of shape (..., 1) and x's dtype: m = max over the last axis,
    d = sum over the last axis of exp(x - m), so that np.exp(x - m) / d is the softmax.
    """
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)   # (..., 1) running max, nothing seen yet
    d = np.zeros(shape, dtype=x.dtype)           # (..., 1) running sum of exp(x_seen - m)
    blocks = []
    for start in range(0, x.shape[-1], block_size):
        blocks.append(x[..., start:start + block_size])      # one read of each block, in order
    row = np.concatenate(blocks, axis=-1)
    m = row.max(axis=-1, keepdims=True)                      # ...then the two-pass softmax
    d = np.exp(row - m).sum(axis=-1, keepdims=True)
    return m, d
