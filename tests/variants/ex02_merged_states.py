"""Correct variant of ex02: each block's own (max, sum) merged into the running state, exp2; an
empty state (-inf, 0) contributes nothing; y written as exp(x - lse) with lse = m + log(d)."""
import numpy as np

LOG2E = 1.4426950408889634


def _merge(m, d, m_b, d_b, c):
    m_new = np.maximum(m, m_b)
    ref = np.where(np.isneginf(m_new), 0, m_new)           # both empty so far: weights 0
    return m_new, d * np.exp2((m - ref) * c) + d_b * np.exp2((m_b - ref) * c)


def online_normalizer(x, block_size):
    c = x.dtype.type(LOG2E)
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)
    d = np.zeros(shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]                  # (..., <= block_size)
        m_b = block.max(axis=-1, keepdims=True)
        ref = np.where(np.isneginf(m_b), 0, m_b)
        d_b = np.exp2((block - ref) * c).sum(axis=-1, keepdims=True)
        m, d = _merge(m, d, m_b, d_b, c)
    return m, d


def _lse(m, d):
    return np.where(d > 0, m + np.log(np.where(d > 0, d, 1)), -np.inf)


def three_pass_softmax(x, block_size):
    c = x.dtype.type(LOG2E)
    n = x.shape[-1]
    m = np.full(x.shape[:-1] + (1,), -np.inf, dtype=x.dtype)
    for start in range(0, n, block_size):
        m = np.maximum(m, x[..., start:start + block_size].max(axis=-1, keepdims=True))
    ref = np.where(np.isneginf(m), 0, m)
    d = np.zeros_like(m)
    for start in range(0, n, block_size):
        d += np.exp2((x[..., start:start + block_size] - ref) * c).sum(axis=-1, keepdims=True)
    lse = np.where(np.isneginf(_lse(m, d)), np.inf, _lse(m, d))   # empty row: exp(-inf) = 0
    y = np.zeros_like(x)
    for start in range(0, n, block_size):
        y[..., start:start + block_size] = np.exp(x[..., start:start + block_size] - lse)
    return y


def online_softmax(x, block_size):
    lse = _lse(*online_normalizer(x, block_size))
    lse = np.where(np.isneginf(lse), np.inf, lse)
    y = np.empty_like(x)
    for start in range(0, x.shape[-1], block_size):
        y[..., start:start + block_size] = np.exp(x[..., start:start + block_size] - lse)
    return y
