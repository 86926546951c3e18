"""Mutant of ex11: takes a batch with one empty sequence for a prefill (min instead of max of the
lengths), so the others' new tokens ignore their cached tokens."""
from flashlib import flash_attention

EXPECTED_HINT = "holding nothing at all"


def attend(q, k, v, cache=None):
    if cache is None:
        return flash_attention(q, k, v, causal=True)
    prefill = min(cache.lengths) == 0
    cache.append(k, v)
    if prefill:
        return flash_attention(q, k, v, causal=True)
    return cache.attend(q)
