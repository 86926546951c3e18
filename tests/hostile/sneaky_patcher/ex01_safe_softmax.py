"""Hostile: patches numpy where the student process does not look (a private submodule's
isclose, which numpy's own comparisons call), then returns a wrong answer. The comparisons run in
the grader's process, so the patch changes nothing. Expected: failed, no check passes."""
import numpy as np

core = getattr(np, "_core", None) or np.core
core.numeric.isclose = lambda a, b, *args, **kwargs: np.ones(np.broadcast(a, b).shape, bool)
core.numeric.allclose = lambda *args, **kwargs: True


def safe_softmax(x):
    return np.ones_like(x)
