"""Mutant of ex11: forgets causal=True, so every token also attends to the tokens after it."""
from flashlib import flash_attention

EXPECTED_HINT = "causal=True"


def attend(q, k, v, cache=None):
    if cache is None:
        return flash_attention(q, k, v)
    prefill = max(cache.lengths) == 0
    cache.append(k, v)
    if prefill:
        return flash_attention(q, k, v)
    return cache.attend(q)
