"""The online-softmax tile update shared by every attention kernel (dense, FA1, block-sparse, decode).

One step of FlashAttention-2's inner loop (Dao 2023, Algorithm 1, lines 8-10) on tiles already in
registers. Scores are in base 2: the kernels multiply Q K^T by ``scale * log2(e)`` so that
``exp2`` (one hardware instruction) replaces ``exp``; the lse is converted back to natural log
at the end. Normalisation is deferred: ``acc`` holds sum_j exp2(s_j - m) v_j and ``l`` the
matching sum, divided once after the last tile.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log(x) = log2(x) * LN2


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    """Fold one tile of base-2 scores into the running state.

    acc (BM, BD) float32; m_i, l_i (BM,) float32; s (BM, BN) float32, -inf where masked;
    v (BN, BD) in the input dtype. Returns the new (acc, m_i, l_i).
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))                    # (BM,)
    # a row that has seen only masked keys keeps m = -inf; exp2(-inf - -inf) would be NaN
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)    # (BM,)
    alpha = tl.math.exp2(m_i - m_safe)                       # (BM,) rescale of the old state
    p = tl.math.exp2(s - m_safe[:, None])                    # (BM, BN)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # (BM, BD)
    return acc, m_new, l_i


@triton.jit
def finalize(acc, m_i, l_i):
    """Normalise once at the end: out = acc / l, lse = ln(sum exp(s)); empty rows -> 0, -inf."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    return out, lse


@triton.jit
def key_range(start_m, Nq, Nk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key blocks a query block [start_m, start_m + BLOCK_M) needs, split at ``n_full``.

    Keys [0, n_full) are visible to every row of the block: no mask, whole blocks. Keys
    [n_full, hi) are the causal diagonal band and/or the ragged tail: masked. Keys >= hi are above
    the diagonal for every row and are never loaded. Bottom-right causal: row i sees j <= i + Nk - Nq.
    """
    if CAUSAL:
        offset = Nk - Nq
        hi = tl.minimum(Nk, tl.maximum(start_m + BLOCK_M + offset, 0))
        n_full = tl.minimum(tl.maximum(start_m + offset + 1, 0), Nk) // BLOCK_N * BLOCK_N
    else:
        hi = Nk
        n_full = Nk // BLOCK_N * BLOCK_N
    return n_full, hi
