"""Mutant of ex11: after appending, attends over the new tokens alone (as in a prefill)."""
from flashlib import flash_attention

EXPECTED_HINT = "not only to each other"


def attend(q, k, v, cache=None):
    if cache is not None:
        cache.append(k, v)
    return flash_attention(q, k, v, causal=True)
