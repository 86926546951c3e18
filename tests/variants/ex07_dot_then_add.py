"""Correct variant of ex07: p @ v in its own dot, added to the rescaled acc afterwards."""
import flashlib  # noqa: F401
import triton
import triton.language as tl


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    row_max = tl.max(s, axis=1)
    m_new = tl.where(row_max > m_i, row_max, m_i)
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - shift[:, None])
    alpha = tl.math.exp2(m_i - shift)
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc * alpha[:, None] + pv, m_new, l_i * alpha + tl.sum(p, axis=1)
