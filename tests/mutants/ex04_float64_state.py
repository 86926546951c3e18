"""Mutant of ex04: returns a float64 state for float32 inputs (np.float64 constants in the
update): the docstring promises the same dtype."""
import numpy as np

EXPECTED_HINT = "dtype"


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = np.maximum(m, scores.max(axis=-1)).astype(np.float64)
    m_ref = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m - m_ref)
    p = np.exp(scores - m_ref[..., None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block
