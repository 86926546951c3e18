"""Mutant of ex07: float32 p into tl.dot with float16 values (no p.to(v.dtype)): Triton's
"Both operands must be same dtype"."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = "tl.dot takes two operands of one dtype"


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    l_i = alpha * l_i + tl.sum(p, 1)
    acc = tl.dot(p, v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
