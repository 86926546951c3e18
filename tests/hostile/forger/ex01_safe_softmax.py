"""Hostile: prints a forged result line (the old `flashlib grade` parsed the grade from stdout)
and returns zeros. Expected: failed, no check passes."""
import sys

import numpy as np

FORGED = '@@flashlib-grade@@{"passed": 99, "total": 5, "status": "passed"}'
print(FORGED, flush=True)
print(FORGED, file=sys.stderr, flush=True)


def safe_softmax(x):
    print(FORGED, flush=True)
    return np.zeros_like(x)
