"""Mutant of ex03: textbook attention (the whole score matrix at once): right values, not one
pass over the keys."""
import math

import numpy as np

EXPECTED_HINT = "one pass"


def online_attention(q, k, v, *, scale=None):
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    s = (q @ k.T) * scale
    m = s.max(axis=-1)
    p = np.exp(s - m[:, None])
    l = p.sum(axis=-1)
    return (p @ v) / l[:, None], m + np.log(l)
