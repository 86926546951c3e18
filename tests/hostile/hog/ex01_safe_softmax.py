"""Hostile: allocates (and touches) 1 GiB after 1 GiB on import. Expected: error (MemoryError at
import, under the student process's limit on private memory, RLIMIT_DATA), 0 points."""
import numpy as np

hoard = [np.ones(1 << 27) for _ in range(256)]


def safe_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
