"""Mutant of ex06: no -inf guard: rows that have seen no key become NaN."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = 'exp2(-inf - (-inf)) is NaN'


@triton.jit
def fa1_rescale(o, l, m, m_tilde, l_tilde, pv):
    m_new = tl.maximum(m, m_tilde)
    m_ref = m_new
    old = tl.math.exp2(m - m_ref)
    new = tl.math.exp2(m_tilde - m_ref)
    l_new = old * l + new * l_tilde
    l_div = l_new
    o = ((l * old)[:, None] * o + new[:, None] * pv) / l_div[:, None]
    return o, l_new, m_new
