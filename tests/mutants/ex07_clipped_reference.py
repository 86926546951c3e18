"""Mutant of ex07: -1e4 as the floor of the reference max instead of handling -inf: rows whose
scores all lie below -1e4 lose everything."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = "-1e4"


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.maximum(m_new, -1e4)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    l_i = alpha * l_i + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
