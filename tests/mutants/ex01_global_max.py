"""Mutant of ex01: one max for the whole array instead of each row's own."""
import numpy as np

EXPECTED_HINT = "its own max"


def safe_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum(axis=-1, keepdims=True)
