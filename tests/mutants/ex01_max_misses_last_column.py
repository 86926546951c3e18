"""Mutant of ex01: the max loop stops one column short (range(N - 1)): right unless the last
column is the max by more than exp's range."""
import numpy as np

EXPECTED_HINT = "the max must come from the whole row"


def safe_softmax(x):
    m = x[..., :1].copy()
    for j in range(1, x.shape[-1] - 1):
        m = np.maximum(m, x[..., j:j + 1])
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)
