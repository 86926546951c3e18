"""Mutant of ex02: blocks of a hard-coded 256 columns, whatever block_size says."""
import numpy as np

EXPECTED_HINT = "block_size"


def online_normalizer(x, block_size):
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)
    d = np.zeros(shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], 256):
        block = x[..., start:start + 256]
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))
        d = d * np.exp(m - m_new) + np.exp(block - m_new).sum(axis=-1, keepdims=True)
        m = m_new
    return m, d
