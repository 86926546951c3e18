"""Mutant of ex04: the max of this block instead of the running max."""
import numpy as np

EXPECTED_HINT = "running max"


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = scores.max(axis=-1)
    m_ref = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m - m_ref)
    p = np.exp(scores - m_ref[..., None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block
