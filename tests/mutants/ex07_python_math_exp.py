"""Mutant of ex07: Python's math.exp inside the kernel (a Python function cannot take a Triton tensor)."""
import math

import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = "inside a @triton.jit kernel use Triton's functions"


@triton.jit
def tile_update(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = math.exp(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    l_i = alpha * l_i + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
