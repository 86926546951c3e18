"""Mutant of ex11: takes a call of more than 20 new tokens for a prefill (one past the longest
decode step a grader might try), so a longer decode step attends only to its own tokens, never to
those already cached."""
from flashlib import flash_attention

EXPECTED_HINT = "not only to each other"


def attend(q, k, v, cache=None):
    if cache is None:
        return flash_attention(q, k, v, causal=True)
    prefill = max(cache.lengths) == 0 or q.shape[2] > 20
    cache.append(k, v)
    if prefill:
        return flash_attention(q, k, v, causal=True)
    return cache.attend(q)
