"""Mutant of ex02: rounds block_size up to a power of two: right (m, d), but reads more columns at a
time than asked, which shows only when block_size is not a power of two."""
import numpy as np

EXPECTED_HINT = "one pass"


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
    bs = 1 << (block_size - 1).bit_length()    # round block up to a power of two (nicer tiles)
    for start in range(0, x.shape[-1], bs):
        block = x[..., start:start + bs]
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))
        d = d * np.exp(m - m_new) + np.exp(block - m_new).sum(axis=-1, keepdims=True)
        m = m_new
    return m, d
