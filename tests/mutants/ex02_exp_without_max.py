"""Mutant of ex02: d accumulates exp(x) instead of exp(x - m_new)."""
import numpy as np

EXPECTED_HINT = "never exp(x)"


def online_normalizer(x, block_size):
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)
    d = np.zeros(shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))
        d = d * np.exp(m - m_new) + np.exp(block).sum(axis=-1, keepdims=True)
        m = m_new
    return m, d
