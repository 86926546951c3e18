"""Mutant of ex01: divides by the largest exp instead of their sum."""
import numpy as np

EXPECTED_HINT = "by its sum"


def safe_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.max(axis=-1, keepdims=True)
