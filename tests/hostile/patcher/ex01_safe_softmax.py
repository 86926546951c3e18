"""Hostile: makes every comparison of numpy and torch say "equal", then returns a wrong answer.
Expected: not accepted (changes numpy.allclose while graded), 0 points."""
import numpy as np
import torch

np.allclose = lambda *args, **kwargs: True
np.array_equal = lambda *args, **kwargs: True
np.testing.assert_allclose = lambda *args, **kwargs: None
torch.allclose = lambda *args, **kwargs: True


def safe_softmax(x):
    return x
