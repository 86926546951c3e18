"""Mutant of ex07: acc kept normalised inside the loop (FA1's O); the final division is one too many."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = "keep it unnormalised"


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    l_new = alpha * l_i + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * (alpha * l_i)[:, None], input_precision=DOT_PRECISION)
    acc = acc / tl.where(l_new == 0.0, 1.0, l_new)[:, None]
    return acc, m_new, l_new
