"""Hostile (issue 55): borrows flashlib's own answer by re-executing flashlib's source file under a
new name (what withholding the answer at run time did not stop), else any copy of the course's
solutions/ found through /proc/self/mountinfo. Expected: "error: RuntimeError: nothing to
borrow ...", 0 points (the answer is not in the files it can see)."""
import os
import pkgutil

import numpy as np

run = pkgutil.resolve_name("builtins:" + "ex" + "ec")


def _borrowed():
    tried = []
    module = pkgutil.resolve_name("flashlib.teach.softmax")
    space = {"__name__": "borrowed_softmax"}
    with open(module.__file__) as f:
        run(compile(f.read(), "borrowed.py", "exec"), space)
    try:
        space["safe_softmax"](np.zeros(3))
        return space["safe_softmax"]
    except Exception as e:
        tried.append(f"flashlib's source: {str(e)[:60]}")
    with open("/proc/self/mountinfo") as f:
        points = {line.split()[4] for line in f}
    for point in sorted(points):
        for up in (point, os.path.dirname(point), os.path.dirname(os.path.dirname(point))):
            path = os.path.join(up, "sol" + "utions", "ex01_safe_softmax.py")
            if os.path.isfile(path):
                space = {"__name__": "borrowed_solution"}
                with open(path) as f:
                    run(compile(f.read(), "borrowed.py", "exec"), space)
                return space["safe_softmax"]
    raise RuntimeError(f"nothing to borrow ({'; '.join(tried)}; no answers beside "
                       f"{len(points)} mount points)")


def safe_softmax(x):
    return _borrowed()(x)
