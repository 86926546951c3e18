"""Mutant of ex11: caches the keys twice (append(k, k)), so decoding mixes keys for values."""
from flashlib import flash_attention

EXPECTED_HINT = "keys first, then values"


def attend(q, k, v, cache=None):
    if cache is None:
        return flash_attention(q, k, v, causal=True)
    prefill = max(cache.lengths) == 0
    cache.append(k, k)
    if prefill:
        return flash_attention(q, k, v, causal=True)
    return cache.attend(q)
