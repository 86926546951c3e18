"""Mutant of ex04: alpha = exp(m_old) / exp(m_new), equal on paper, inf / inf = NaN once the
scores pass exp's range (88.72 in float32)."""
import numpy as np

EXPECTED_HINT = "exponent"


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = np.maximum(m, scores.max(axis=-1))
    m_ref = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m) / np.exp(m_ref)
    p = np.exp(scores - m_ref[..., None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block
