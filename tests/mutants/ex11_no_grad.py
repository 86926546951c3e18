"""Mutant of ex11: attend runs under torch.no_grad() (attention while sampling needs no gradient,
and the cache is written in place): the outputs are right, but training gets no gradient
through the attention."""
import torch

from flashlib import flash_attention

EXPECTED_HINT = "training needs gradients"


def attend(q, k, v, cache=None):
    with torch.no_grad():
        if cache is None:
            return flash_attention(q, k, v, causal=True)
        prefill = max(cache.lengths) == 0
        cache.append(k, v)
        if prefill:
            return flash_attention(q, k, v, causal=True)
        return cache.attend(q)
