"""Mutant of ex02: keeps the max of the current block instead of the running max."""
import numpy as np

EXPECTED_HINT = "running max"


def online_normalizer(x, block_size):
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)
    d = np.zeros(shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = block.max(axis=-1, keepdims=True)
        d = d * np.exp(m - m_new) + np.exp(block - m_new).sum(axis=-1, keepdims=True)
        m = m_new
    return m, d
