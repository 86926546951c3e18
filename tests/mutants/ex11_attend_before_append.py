"""Mutant of ex11: decodes before appending, so a new token does not attend to itself."""
from flashlib import flash_attention

EXPECTED_HINT = "before attending"


def attend(q, k, v, cache=None):
    if cache is None:
        return flash_attention(q, k, v, causal=True)
    if max(cache.lengths) == 0:
        cache.append(k, v)
        return flash_attention(q, k, v, causal=True)
    out = cache.attend(q)
    cache.append(k, v)
    return out
