"""Mutant of ex01: subtracts the row min instead of the row max (exponents can be large)."""
import numpy as np

EXPECTED_HINT = "not its min"


def safe_softmax(x):
    e = np.exp(x - x.min(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
