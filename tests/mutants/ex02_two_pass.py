"""Mutant of ex02: the three-pass way (max of the whole row, then the sum): right values, but not
one pass over the row in blocks."""
import numpy as np

EXPECTED_HINT = "one pass"


def online_normalizer(x, block_size):
    m = x.max(axis=-1, keepdims=True)
    return m, np.exp(x - m).sum(axis=-1, keepdims=True)
