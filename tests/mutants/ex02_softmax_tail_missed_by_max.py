"""Mutant of ex02: three_pass_softmax's first sweep stops at the last whole block (N // block_size
blocks): the max misses a shorter last block; right unless that block holds a value far above
the rest."""
import numpy as np

EXPECTED_HINT = 'mishandles the last, shorter block'


def three_pass_softmax(x, block_size):
    """Softmax over the last axis of ``x`` in three sweeps over its blocks: max, sum, output.

    x: NumPy array (..., N) of float32 or float64, N >= 1, finite or -inf. block_size: int >= 1.
    Returns y, x's shape and dtype: each row's softmax (exp(x - m) / d); 0 wherever x is -inf,
    and a row of -inf only is all 0 (no NaN). Reads x in exactly three sweeps over its blocks
    (each reading every column once, block_size columns at a time); does not modify x.
    """
    blocks = range(0, x.shape[-1], block_size)
    m = np.full(x.shape[:-1] + (1,), -np.inf, dtype=x.dtype)       # (..., 1)
    for start in range(0, x.shape[-1] // block_size * block_size, block_size):   # sweep 1
        m = np.maximum(m, x[..., start:start + block_size].max(axis=-1, keepdims=True))
    m_ref = np.where(np.isneginf(m), 0, m)            # a row of -inf only: exp(-inf - 0) = 0
    d = np.zeros_like(m)                                             # (..., 1)
    for start in blocks:                                             # sweep 2: the normaliser
        d = d + np.exp(x[..., start:start + block_size] - m_ref).sum(axis=-1, keepdims=True)
    d = np.where(d > 0, d, 1)                         # ... and 0 / 1 = 0 instead of 0 / 0
    y = np.empty(x.shape, dtype=x.dtype)
    for start in blocks:                                             # sweep 3: the output
        y[..., start:start + block_size] = np.exp(x[..., start:start + block_size] - m_ref) / d
    return y


def online_normalizer(x, block_size):
    """One sweep over the last axis of ``x`` in blocks: the row max and the normaliser.

    x: NumPy array (..., N) of float32 or float64, N >= 1, finite or -inf. block_size: int >= 1.
    Returns (m, d), each of shape (..., 1) and x's dtype: m = max over the last axis,
    d = sum over the last axis of exp(x - m), so that np.exp(x - m) / d is the softmax;
    (-inf, 0) for a row of -inf only, never NaN.
    """
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)   # (..., 1) running max, nothing seen yet
    d = np.zeros(shape, dtype=x.dtype)           # (..., 1) running sum of exp(x_seen - m)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]                           # (..., <= block_size)
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))           # (..., 1)
        # only -inf so far: take 0 as the reference, so that exp(-inf - 0) = 0 instead of NaN
        m_ref = np.where(np.isneginf(m_new), 0, m_new)
        # the old terms were relative to m; exp(-inf) = 0 makes the first block work too
        d = d * np.exp(m - m_ref) + np.exp(block - m_ref).sum(axis=-1, keepdims=True)
        m = m_new
    return m, d


def online_softmax(x, block_size):
    """Softmax over the last axis of ``x`` in two sweeps: (m, d) online, then the output.

    x, block_size and the result: as ``three_pass_softmax``, but x is read in exactly two
    sweeps over its blocks: the first finds the row max and the normaliser together, the second
    writes y. Does not modify x.
    """
    m, d = online_normalizer(x, block_size)                                 # sweep 1
    m = np.where(np.isneginf(m), 0, m)                # a row of -inf only: y = 0 / 1 = 0
    d = np.where(d > 0, d, 1)
    y = np.empty(x.shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):                         # sweep 2
        y[..., start:start + block_size] = np.exp(x[..., start:start + block_size] - m) / d
    return y
