"""Hostile: on import, three forked children each fill 512 MiB (under the per-process limit of
--memory 1, 1.5 GiB together) and hold it while the grader checks; the answer is right.
Expected: crashed (over the memory limit, counted across the student's processes), 0 points."""
import os
import time

import numpy as np

ready_r, ready_w = os.pipe()
for _ in range(3):
    if os.fork() == 0:
        hoard = b"x" * (512 << 20)
        os.write(ready_w, b"!")
        time.sleep(120)
        os._exit(0)
for _ in range(3):
    os.read(ready_r, 1)
time.sleep(1)                            # the grader looks every 0.1 s


def safe_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
