"""Mutant of ex11: grouped-query heads handled by hand on the training and prefill path: k and v
repeated twice along the heads before flash_attention (which takes fewer K/V heads as they are):
right for groups of 2 and 4, refused by flash_attention for a group of 1 or 3."""
from flashlib import flash_attention

EXPECTED_HINT = "grouped"


def attend(q, k, v, cache=None):
    prefill = cache is not None and max(cache.lengths) == 0
    if cache is not None:
        cache.append(k, v)
    if cache is None or prefill:
        if q.shape[1] != k.shape[1]:
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        return flash_attention(q, k, v, causal=True)
    return cache.attend(q)
