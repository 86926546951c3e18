"""Mutant of ex01: computes "in float64" through astype(copy=False), which for a float64 input
is the input itself: x is changed in place (float32 inputs are left alone)."""
import numpy as np

EXPECTED_HINT = "changed its argument x (float64) in place"


def safe_softmax(x):
    z = x.astype(np.float64, copy=False)
    z -= z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)
