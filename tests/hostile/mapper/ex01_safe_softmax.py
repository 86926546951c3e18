"""Hostile: maps 2 GiB of shared anonymous memory on import and touches every page (RLIMIT_DATA
counts private mappings only), then answers right. Graded with --memory 1. Expected: crashed
(over the memory limit: the grader measures the student's processes together), 0 points."""
import mmap
import time

import numpy as np

hoard = mmap.mmap(-1, 2 << 30)          # MAP_SHARED | MAP_ANONYMOUS
for offset in range(0, len(hoard), mmap.PAGESIZE):
    hoard[offset] = 1
time.sleep(1)                            # held while graded (the grader looks every 0.1 s)


def safe_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
