"""Mutant of ex04: P = exp(S) * exp(-m_new), equal on paper, inf * 0 once the scores pass exp's
range."""
import numpy as np

EXPECTED_HINT = "exponent"


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = np.maximum(m, scores.max(axis=-1))
    m_ref = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m - m_ref)
    p = np.exp(scores) * np.exp(-m_ref)[..., None]
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block
