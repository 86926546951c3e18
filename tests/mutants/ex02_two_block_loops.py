"""Mutant of ex02: two loops over the blocks, one for the max, one for the sum: two passes."""
import numpy as np

EXPECTED_HINT = "one pass"


def online_normalizer(x, block_size):
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)
    d = np.zeros(shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        m = np.maximum(m, x[..., start:start + block_size].max(axis=-1, keepdims=True))
    for start in range(0, x.shape[-1], block_size):
        d = d + np.exp(x[..., start:start + block_size] - m).sum(axis=-1, keepdims=True)
    return m, d
