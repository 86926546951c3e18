"""The online-softmax tile update shared by every attention kernel (dense, FA1, block-sparse, decode).

One step of FlashAttention-2's inner loop (Dao 2023, Algorithm 1, lines 8-10) on tiles already in
registers. Scores are in base 2: the kernels multiply Q K^T by ``scale * log2(e)`` so that
``exp2`` (one hardware instruction) replaces ``exp``; the lse is converted back to natural log
at the end. Normalisation is deferred: ``acc`` holds sum_j exp2(s_j - m) v_j and ``l`` the
matching sum, divided once after the last tile.
"""
import torch
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
def tile_update_split(acc, m_i, l_i, s, r, v, DOT_PRECISION: tl.constexpr):
    """``tile_update`` for the scores s + r[:, None], given apart: r (BM,) a per-row term (ALiBi's
    bias split off the diagonal, ``fa2_fwd.attend_tile``). The row term joins the max, not the
    scores: exp2(s + r - m) = exp2(s - (m - r)), a BM-vector's work per tile instead of a tile's.
    m_i stays the max of the true scores s + r, so a far block's large |r| never rounds it."""
    m_new = tl.maximum(m_i, tl.max(s, 1) + r)                # (BM,)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)    # (BM,) as tile_update
    alpha = tl.math.exp2(m_i - m_safe)                       # (BM,)
    p = tl.math.exp2(s - (m_safe - r)[:, None])              # (BM, BN)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # (BM, BD)
    return acc, m_new, l_i


@triton.jit
def tile_update_bounded(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    """``tile_update`` for scores with a known bound, without the running max.

    The max is there so that exp2 neither overflows nor underflows. Scores capped to |s| <= c
    (a softcap: ``kernels.score_mod``) need no max: with a fixed offset m (m_i, set once by the
    kernel; see ``bounded_offset``) every exp2(s - m) lies in [2^(-c - m), 2^(c - m)], inside
    float32's and bfloat16's range (not float16's: 2^-24 ... 2^16). Per score this saves the max,
    and per tile the row reductions and the rescale of acc (BD / BN multiplies per score).
    """
    p = tl.math.exp2(s - m_i[:, None])                       # (BM, BN)
    l_i = l_i + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # (BM, BD)
    return acc, m_i, l_i


BOUNDED_MAX = 80.0   # base 2: caps up to 80 / log2(e) = 55.4 (Gemma 2's attention softcap is 50)


def bounded_offset(bound, dtype):
    """The fixed offset m of ``tile_update_bounded`` for scores within [-bound, bound] (base 2)
    and P in ``dtype``, or None where the running max is needed: p <= 2^56, so sums over 2^31 keys
    of values up to 2^40 stay finite, and a row's largest p >= 2^(56 - 2 bound) >= 2^-104, a
    normal float with 22 binades below it before float32's and bfloat16's smallest normal."""
    if bound is None or bound > BOUNDED_MAX or dtype not in (torch.bfloat16, torch.float32):
        return None
    return max(0.0, bound - 56.0)


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
