"""Mutant of ex06: e^(m - m_new) as exp2(m) / exp2(m_new): equal on paper, inf / inf once the
(base-2) scores pass 128."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = "exponent"


@triton.jit
def fa1_rescale(o, l, m, m_tilde, l_tilde, pv):
    m_new = tl.maximum(m, m_tilde)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    old = tl.math.exp2(m) / tl.math.exp2(m_ref)
    new = tl.math.exp2(m_tilde) / tl.math.exp2(m_ref)
    l_new = old * l + new * l_tilde
    l_div = tl.where(l_new == 0.0, 1.0, l_new)
    o = ((l * old)[:, None] * o + new[:, None] * pv) / l_div[:, None]
    return o, l_new, m_new
