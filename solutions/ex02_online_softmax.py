"""Exercise 02 (lesson 02): a long row's softmax streamed block by block: three sweeps, then two.

A row too long for fast memory (a GPU's SRAM) stays in slow memory (HBM) and is read a block of
``block_size`` columns at a time; every sweep over its blocks reads the whole row again. Lesson
01's safe softmax needs three sweeps: the row max m, then d = sum_j exp(x_j - m), then the output
y = exp(x - m) / d. Milakov & Gimelshein (2018, Algorithm 3) fold the first two into ONE sweep
by keeping, after each block, the running max m and the surrogate normaliser

    d' = sum over the elements seen so far of exp(x_j - m),   m = max of the elements seen so far.

When a block raises the running max from m_old to m_new, every term already in d' was computed
relative to m_old: d' must be rescaled by exp(m_old - m_new) (<= 1) before the block's own terms
exp(x_j - m_new) are added. After the last block, m is the row max and d' is exactly d. This
update is what makes FlashAttention's tiling possible.

You write three functions:

- ``three_pass_softmax``: lesson 01's three passes, each a sweep over the blocks;
- ``online_normalizer``: (m, d) in one sweep;
- ``online_softmax``: the online normaliser's sweep, then one sweep writing y: two sweeps.

The rules of the stream, for all three: read x only a block at a time, ``x[..., start:stop]``
with at most ``block_size`` columns (every row at once; the last block of a row may be shorter;
block_size need not divide N and may exceed it), and hold only per-row numbers between blocks.
x may hold -inf (a masked score: weight 0). A row of -inf only has nothing to normalise: its
softmax is all 0 and its (m, d) is (-inf, 0), never NaN. The first blocks of a row may be all
-inf too. Scores may be large (thousands, far past exp's overflow point at 88.72 in float32).

Compare ``flashlib.teach.softmax``'s ``safe_softmax`` (three passes over a row held whole) and
``online_normalizer``/``online_softmax`` (the library's streaming versions, which merge (m, d)
states). Then run ``flashlib check ex02``.
"""
import numpy as np


def three_pass_softmax(x, block_size):
    """Softmax over the last axis of ``x`` in three sweeps over its blocks: max, sum, output.

    x: NumPy array (..., N) of float32 or float64, N >= 1, finite or -inf. block_size: int >= 1.
    Returns y, x's shape and dtype: each row's softmax (exp(x - m) / d); 0 wherever x is -inf,
    and a row of -inf only is all 0 (no NaN). Reads x in exactly three sweeps over its blocks
    (each reading every column once, block_size columns at a time); does not modify x.
    """
    # BEGIN SOLUTION
    blocks = range(0, x.shape[-1], block_size)
    m = np.full(x.shape[:-1] + (1,), -np.inf, dtype=x.dtype)       # (..., 1)
    for start in blocks:                                             # sweep 1: the row max
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
    # END SOLUTION


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
    # BEGIN SOLUTION
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]                           # (..., <= block_size)
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))           # (..., 1)
        # only -inf so far: take 0 as the reference, so that exp(-inf - 0) = 0 instead of NaN
        m_ref = np.where(np.isneginf(m_new), 0, m_new)
        # the old terms were relative to m; exp(-inf) = 0 makes the first block work too
        d = d * np.exp(m - m_ref) + np.exp(block - m_ref).sum(axis=-1, keepdims=True)
        m = m_new
    # END SOLUTION
    return m, d


def online_softmax(x, block_size):
    """Softmax over the last axis of ``x`` in two sweeps: (m, d) online, then the output.

    x, block_size and the result: as ``three_pass_softmax``, but x is read in exactly two
    sweeps over its blocks: the first finds the row max and the normaliser together, the second
    writes y. Does not modify x.
    """
    # BEGIN SOLUTION
    m, d = online_normalizer(x, block_size)                                 # sweep 1
    m = np.where(np.isneginf(m), 0, m)                # a row of -inf only: y = 0 / 1 = 0
    d = np.where(d > 0, d, 1)
    y = np.empty(x.shape, dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):                         # sweep 2
        y[..., start:start + block_size] = np.exp(x[..., start:start + block_size] - m) / d
    return y
    # END SOLUTION
