"""Correct variant of ex02: each block's own (max, sum) merged into the running state, exp2."""
import numpy as np

LOG2E = 1.4426950408889634


def online_normalizer(x, block_size):
    c = x.dtype.type(LOG2E)
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)
    d = np.zeros(shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]                  # (..., <= block_size)
        m_b = block.max(axis=-1, keepdims=True)
        d_b = np.exp2((block - m_b) * c).sum(axis=-1, keepdims=True)
        m_new = np.maximum(m, m_b)
        d = d * np.exp2((m - m_new) * c) + d_b * np.exp2((m_b - m_new) * c)
        m = m_new
    return m, d
