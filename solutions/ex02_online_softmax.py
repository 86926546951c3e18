"""Exercise 02 (lesson 02): the online normaliser, one pass instead of two.

The safe softmax reads each row twice before it can write: once for the max m, once for
d = sum_j exp(x_j - m). Milakov & Gimelshein (2018, Algorithm 3) compute both in ONE pass by
keeping, after each block of the row, the running max m and the surrogate normaliser

    d' = sum over the elements seen so far of exp(x_j - m),   m = max of the elements seen so far.

When a new block arrives with its own max, the running max may grow, m_new = max(m_old, block
max); every term already in d' was computed relative to m_old, so d' must be rescaled:

    d' <- d' * exp(m_old - m_new) + sum over the block of exp(x_j - m_new)

(exp(m_old - m_new) <= 1; it is 1 when the max did not change). At the end, m is the row max
and d' is exactly d. This update is what makes FlashAttention's tiling possible.

Walk over the last axis in blocks of ``block_size`` columns (the last block may be shorter).
Compare ``flashlib.teach.softmax.online_normalizer``, the library's version (it merges (m, d) states).

Write the loop below; then run ``flashlib check ex02``.
"""
import numpy as np


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
    # BEGIN SOLUTION
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]                           # (..., <= block_size)
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))           # (..., 1)
        # the old terms were relative to m; exp(-inf) = 0 makes the first block work too
        d = d * np.exp(m - m_new) + np.exp(block - m_new).sum(axis=-1, keepdims=True)
        m = m_new
    # END SOLUTION
    return m, d
