"""Mutant of ex01: the naive softmax, no max subtracted (overflows past 88.72 in float32)."""
import numpy as np

EXPECTED_HINT = "did you subtract the row max"


def safe_softmax(x):
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)
