"""Mutant of ex11: the prefill attends but leaves the prompt out of the cache."""
from flashlib import flash_attention

EXPECTED_HINT = "during the prefill"


def attend(q, k, v, cache=None):
    if cache is None or max(cache.lengths) == 0:
        return flash_attention(q, k, v, causal=True)
    cache.append(k, v)
    return cache.attend(q)
