"""Mutant of ex02: works in float64 and returns float64 for a float32 row (the docstring
promises x's dtype)."""
import numpy as np

EXPECTED_HINT = "dtype"


def online_normalizer(x, block_size):
    x = x.astype(np.float64)
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf)
    d = np.zeros(shape)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))
        d = d * np.exp(m - m_new) + np.exp(block - m_new).sum(axis=-1, keepdims=True)
        m = m_new
    return m, d
