"""Hostile (or just noisy): prints 10 MB on import and more on every call; the answer is right.
Expected: passed (5/5): output is drained and dropped."""
import numpy as np

print("x" * (10 << 20))


def safe_softmax(x):
    print("debug " * 200)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
