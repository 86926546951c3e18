"""Exercise 07 (lesson 07): the inner-loop body of the FlashAttention-2 forward kernel, in Triton.

flashlib's FA2 kernel (``flashlib/kernels/fa2_fwd.py``, Dao 2023, Algorithm 1) gives each program
BLOCK_M query rows and keeps their state in registers: ``m_i`` (BM,) the running max of the
scores, ``l_i`` (BM,) the running sum of exp2(s - m_i), and ``acc`` (BM, BD) the UNNORMALISED
output. For every key/value block it computes the scores and calls ``tile_update``, the function
you write here. The kernel has already done two things to the scores ``s`` (BM, BN):

- they are in base 2: Q K^T was multiplied by ``scale * log2(e)``, so exp(scale * q.k - c) is
  ``tl.math.exp2(s - c')``: one hardware instruction, the scale folded into one multiply;
- they are -inf where masked (causal band, keys past Nk).

The update, per row (all in float32):

    m_new = max(m_i, rowmax(s))
    alpha = exp2(m_i - m_new)                  # rescales what was accumulated so far
    p     = exp2(s - m_new[:, None])           # (BM, BN)
    l_i   = alpha * l_i + rowsum(p)
    acc   = alpha[:, None] * acc + p @ v       # tl.dot(p.to(v.dtype), v, acc, input_precision=...)

No division by l here: the kernel divides once after the last block (deferred normalisation,
``flashlib.kernels.tile.finalize``) and writes lse = (m + log2(l)) * ln(2).

RETURN ORDER: ``return acc, m_new, l_i``, the state in the order it comes in (acc, m_i, l_i),
as flashlib's kernels unpack it. This is NOT exercise 04's order: its NumPy step takes
(scores, v_block, m, l, acc) and returns (m, l, acc). Returned in another order, the kernel
combines blocks of different shapes and Triton stops with "Cannot make_shape_compatible".

A row that has seen only masked keys so far (causal with Nq > Nk, a query with no key yet) has
m_new = -inf, and exp2(-inf - (-inf)) is NaN. Such a row must keep m = -inf, l = 0, acc = 0:
where m_new is -inf, use 0 as the reference max in alpha and p (they then come out 0).

Triton notes: use ``tl.maximum``, ``tl.max(x, 1)``, ``tl.sum(x, 1)``, ``tl.where``,
``tl.math.exp2``; index a (BM,) vector as ``x[:, None]`` to broadcast it over a row; pass
``input_precision=DOT_PRECISION`` to ``tl.dot`` (exact "ieee" float32 dots unless TF32 is asked).
``flashlib.kernels.tile.tile_update`` is the library's answer: try first.

Check it: ``flashlib check ex07`` (it runs flashlib's FA2 kernel with your update, through
Triton's interpreter on a CPU).
"""
import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import triton
import triton.language as tl


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    """Fold one block of base-2 scores into the running state; return (acc, m_i, l_i), in
    this order (not ex04's (m, l, acc)).

    acc (BM, BD) float32, unnormalised output; m_i, l_i (BM,) float32, running max and sum
    (-inf and 0 before the first block); s (BM, BN) float32 base-2 scores, -inf where masked;
    v (BN, BD) this block's values in the input dtype. Rows that have only seen -inf keep
    m = -inf, l = 0, acc = 0 (no NaN). No division by l: normalisation is deferred.
    """
    # BEGIN SOLUTION
    m_new = tl.maximum(m_i, tl.max(s, 1))                    # (BM,) running max
    # rows with only masked keys so far: reference 0, so exp2(-inf - 0) = 0 instead of NaN
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)     # (BM,)
    alpha = tl.math.exp2(m_i - m_ref)                        # (BM,) 0 on a row's first block
    p = tl.math.exp2(s - m_ref[:, None])                     # (BM, BN)
    l_i = alpha * l_i + tl.sum(p, 1)                         # (BM,)
    acc = acc * alpha[:, None]                               # (BM, BD)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # (BM, BD) += p @ v
    return acc, m_new, l_i
    # END SOLUTION
