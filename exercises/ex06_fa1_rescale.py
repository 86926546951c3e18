"""Exercise 06 (lesson 06): FlashAttention-1's rescaling update, as a Triton function.

In FlashAttention-1 (Dao et al. 2022, arXiv 2205.14135, Algorithm 1) the outer loop walks the
key/value blocks and the inner loop the query blocks, so a block of query rows cannot keep its
running state in registers: O_i, l_i, m_i live in HBM and every inner step loads them, folds in
one tile, and stores them back. ``flashlib.kernels.fa1.fa1_forward(..., rescale=fa1_rescale)``
runs that kernel and, for every tile, computes the block statistics (line 10)

    m~  = rowmax(S_ij)                  (BM,)   -inf for a row that sees no key of this tile
    P~  = exp(S_ij - m~)                (BM, BN)
    l~  = rowsum(P~)                    (BM,)
    pv  = P~ @ V_j                      (BM, BD)

then calls your function for lines 11-13 with the old state loaded from HBM:

    m_new = max(m, m~)
    l_new = e^(m - m_new) * l + e^(m~ - m_new) * l~
    O_new = diag(l_new)^-1 ( diag(l) e^(m - m_new) O + e^(m~ - m_new) pv )

O is stored NORMALISED (that is what the paper does): un-normalise it with l, rescale, add the
new block, divide by l_new.

Two details of flashlib's kernels:
- scores are in base 2: the kernel multiplies Q K^T by scale * log2(e), so every e^x above is
  ``tl.math.exp2(x)`` (one hardware instruction). m, m~ are in those units.
- masking: a row that has seen no key yet has m = -inf, l = 0, O = 0; if this tile gives it
  nothing either (m~ = -inf, l~ = 0, pv = 0), then m_new = -inf and exp2(-inf - (-inf)) is NaN.
  Such a row must come out with m = -inf, l = 0, O = 0: use 0 instead of -inf as the reference
  max in the exponents, and divide by 1 where l_new is 0.

Write the body below (Triton: ``tl.maximum``, ``tl.where``, ``tl.math.exp2``, ``x[:, None]`` to
broadcast a row vector over columns); then run ``flashlib.course.check("ex06")``.
"""
import flashlib  # noqa: F401  (first: turns Triton's interpreter on where there is no GPU)
import triton
import triton.language as tl


@triton.jit
def fa1_rescale(o, l, m, m_tilde, l_tilde, pv):
    """Algorithm 1, lines 11-13. Returns the new ``(o, l, m)``.

    o: (BM, BD) float32, the normalised output so far; l: (BM,) its sum of exp2(s - m);
    m: (BM,) its running max (base 2, -inf before any key).
    m_tilde, l_tilde: (BM,) this tile's row max and row sum; pv: (BM, BD) float32, P~ @ V_j.
    """
    raise NotImplementedError('ex06: your code goes here, then run `flashlib check ex06`')
