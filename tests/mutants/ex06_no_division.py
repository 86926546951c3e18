"""Mutant of ex06: forgets diag(l_new)^-1: O comes back unnormalised."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = 'divide by l_new'


@triton.jit
def fa1_rescale(o, l, m, m_tilde, l_tilde, pv):
    m_new = tl.maximum(m, m_tilde)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    old = tl.math.exp2(m - m_ref)
    new = tl.math.exp2(m_tilde - m_ref)
    l_new = old * l + new * l_tilde
    l_div = tl.where(l_new == 0.0, 1.0, l_new)
    o = (l * old)[:, None] * o + new[:, None] * pv
    return o, l_new, m_new
