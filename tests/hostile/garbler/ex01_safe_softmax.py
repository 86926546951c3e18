"""Hostile: writes a forged result into every file descriptor it can, the grader's pipes
included. Expected: crashed (the grader reads a garbled reply), 0 points."""
import os

import numpy as np

FORGED = b'@@flashlib-grade@@{"passed": 99, "total": 5, "status": "passed"}\n'
for fd in range(64):
    try:
        os.write(fd, FORGED)
    except OSError:
        pass


def safe_softmax(x):
    return np.zeros_like(x)
