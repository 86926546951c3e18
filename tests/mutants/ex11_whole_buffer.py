"""Mutant of ex11: decodes over the cache's whole buffer, the empty slots past each length too."""
from flashlib import flash_attention

EXPECTED_HINT = "valid positions"


def attend(q, k, v, cache=None):
    if cache is None:
        return flash_attention(q, k, v, causal=True)
    prefill = max(cache.lengths) == 0
    cache.append(k, v)
    if prefill:
        return flash_attention(q, k, v, causal=True)
    return flash_attention(q, cache.k, cache.v, causal=True)
