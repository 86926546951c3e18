"""Mutant of ex06: -1e4 as the floor of the reference max instead of handling -inf: rows whose
scores all lie below -1e4 lose everything."""
import flashlib  # noqa: F401
import triton
import triton.language as tl

EXPECTED_HINT = "-1e4"


@triton.jit
def fa1_rescale(o, l, m, m_tilde, l_tilde, pv):
    m_new = tl.maximum(m, m_tilde)
    m_ref = tl.maximum(m_new, -1e4)
    old = tl.math.exp2(m - m_ref)
    new = tl.math.exp2(m_tilde - m_ref)
    l_new = old * l + new * l_tilde
    l_div = tl.where(l_new == 0.0, 1.0, l_new)
    o = ((l * old)[:, None] * o + new[:, None] * pv) / l_div[:, None]
    return o, l_new, m_new
