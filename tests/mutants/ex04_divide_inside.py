"""Mutant of ex04: divides acc by l inside the loop (normalisation not deferred)."""
import numpy as np

EXPECTED_HINT = "deferred normalisation"


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = np.maximum(m, scores.max(axis=-1))
    m_ref = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m - m_ref)
    p = np.exp(scores - m_ref[..., None])
    l_new = alpha * l + p.sum(axis=-1)
    acc_new = alpha[..., None] * acc + p @ v_block
    return m_new, l_new, acc_new / np.where(l_new > 0, l_new, 1.0)[..., None]
