"""Mutant of ex07: no -inf guard: rows that have seen only masked keys become NaN."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = "exp2(-inf - (-inf)) is NaN"


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = alpha * l_i + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
