"""Mutant of ex01: max and sum over axis 0 instead of the last axis."""
import numpy as np

EXPECTED_HINT = "axis=-1"


def safe_softmax(x):
    m = x.max(axis=0, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=0, keepdims=True)
