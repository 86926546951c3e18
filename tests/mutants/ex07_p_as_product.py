"""Mutant of ex07: p = exp2(s) * exp2(-m_new): equal on paper, inf * 0 once the base-2 scores
pass 128."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = "exponent"


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s) * tl.math.exp2(-m_ref)[:, None]
    l_i = alpha * l_i + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
