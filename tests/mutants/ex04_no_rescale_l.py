"""Mutant of ex04: forgets to rescale the running sum l."""
import numpy as np

EXPECTED_HINT = "did you rescale l"


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = np.maximum(m, scores.max(axis=-1))
    m_ref = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m - m_ref)
    p = np.exp(scores - m_ref[..., None])
    return m_new, l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block
