"""Mutant of ex06: uses e instead of 2 as the base, although the scores are base 2."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = 'use tl.math.exp2'


@triton.jit
def fa1_rescale(o, l, m, m_tilde, l_tilde, pv):
    m_new = tl.maximum(m, m_tilde)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    old = tl.exp(m - m_ref)
    new = tl.exp(m_tilde - m_ref)
    l_new = old * l + new * l_tilde
    l_div = tl.where(l_new == 0.0, 1.0, l_new)
    o = ((l * old)[:, None] * o + new[:, None] * pv) / l_div[:, None]
    return o, l_new, m_new
