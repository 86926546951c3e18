"""Mutant of ex04: no -inf guard, so rows with only masked scores so far become NaN."""
import numpy as np

EXPECTED_HINT = "exp(-inf - (-inf)) is NaN"


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = np.maximum(m, scores.max(axis=-1))
    alpha = np.exp(m - m_new)
    p = np.exp(scores - m_new[..., None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block
