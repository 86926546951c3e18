"""Softmax three ways, and the (max, sum) state that makes it streamable.

Follows Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018), sections 2-3,
which FlashAttention's tiling rests on:

- ``naive_softmax``: exp(x) / sum(exp(x)); overflows once x > 88.72 in float32 (exp -> inf).
- ``safe_softmax``: subtract the row max first: 3 passes over x (max, sum, normalise).
- ``online_softmax``: the max m and the surrogate normaliser d' in one pass, rescaling d' by
  exp(m_old - m_new) whenever the max grows; then one pass to normalise: 2 passes.
- ``merge_states``: combine the (m, d) of two chunks, the step that lets chunks be processed
  in any order, in parallel, or block by block.

NumPy, any float dtype, softmax over the last axis.
"""
import numpy as np


def naive_softmax(x):
    """exp(x) / sum(exp(x)) over the last axis. Overflows for x > log(float max)."""
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def safe_softmax(x):
    """Three passes: m = max(x); d = sum(exp(x - m)); y = exp(x - m) / d."""
    m = x.max(axis=-1, keepdims=True)                  # pass 1
    d = np.exp(x - m).sum(axis=-1, keepdims=True)      # pass 2
    return np.exp(x - m) / d                           # pass 3


def merge_states(m1, d1, m2, d2):
    """Merge two (max, sum) states: each d is a sum of exp(x - its own m).

    m = max(m1, m2); d = d1 * exp(m1 - m) + d2 * exp(m2 - m). An empty chunk is (-inf, 0).
    """
    m = np.maximum(m1, m2)
    # exp(-inf - -inf) is nan: an empty state contributes nothing, whatever m is
    with np.errstate(invalid="ignore"):
        s1 = np.where(d1 == 0, 0.0, np.exp(m1 - m))
        s2 = np.where(d2 == 0, 0.0, np.exp(m2 - m))
    return m, d1 * s1 + d2 * s2


def online_normalizer(x, block_size=1):
    """One pass over x in blocks of ``block_size`` columns: running (m, d') over the last axis."""
    shape = x.shape[:-1] + (1,)
    m = np.full(shape, -np.inf, dtype=x.dtype)
    d = np.zeros(shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_block = block.max(axis=-1, keepdims=True)
        d_block = np.exp(block - m_block).sum(axis=-1, keepdims=True)
        m, d = merge_states(m, d, m_block, d_block)
    return m, d


def online_softmax(x, block_size=1):
    """Two passes: (m, d') online, then y = exp(x - m) / d'. Equals safe_softmax for any block size."""
    m, d = online_normalizer(x, block_size)
    return np.exp(x - m) / d
