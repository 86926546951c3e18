"""Mutant of ex02: forgets to rescale d when the running max grows."""
import numpy as np

EXPECTED_HINT = "too large when the max grows"


def online_normalizer(x, block_size):
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)
    d = np.zeros(shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m = np.maximum(m, block.max(axis=-1, keepdims=True))
        d = d + np.exp(block - m).sum(axis=-1, keepdims=True)
    return m, d
