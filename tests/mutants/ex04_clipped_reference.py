"""Mutant of ex04: -1e4 as the floor of the reference max instead of handling -inf: rows whose
scores all lie below -1e4 underflow to l = 0."""
import numpy as np

EXPECTED_HINT = "-1e4"


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = np.maximum(m, scores.max(axis=-1))
    m_ref = np.maximum(m_new, -1e4)
    alpha = np.exp(m - m_ref)
    p = np.exp(scores - m_ref[..., None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block
