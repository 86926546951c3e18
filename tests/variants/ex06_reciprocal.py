"""Correct variant of ex06: the weights of old and new divided by l_new first, then one FMA."""
import flashlib  # noqa: F401
import triton
import triton.language as tl


@triton.jit
def fa1_rescale(o, l, m, m_tilde, l_tilde, pv):
    m_new = tl.maximum(m, m_tilde)
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.math.exp2(m - safe) * l                  # weight of the old (normalised) O
    b = tl.math.exp2(m_tilde - safe)                # weight of the new P~V
    l_new = a + b * l_tilde
    inv = 1.0 / tl.where(l_new > 0.0, l_new, 1.0)
    o = o * (a * inv)[:, None] + pv * (b * inv)[:, None]
    return o, l_new, m_new
