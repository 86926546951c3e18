"""Mutant of ex11: takes any call of more than 8 new tokens for a prefill (a prompt is long, a
decode step short), so a long decode step (a chunk of a long prompt, or many draft tokens)
attends only to its own tokens, never to those already cached."""
from flashlib import flash_attention

EXPECTED_HINT = "not only to each other"


def attend(q, k, v, cache=None):
    if cache is None:
        return flash_attention(q, k, v, causal=True)
    cache.append(k, v)
    if q.shape[2] > 8:                                  # a long call: taken for the prompt
        return flash_attention(q, k, v, causal=True)
    return cache.attend(q)
