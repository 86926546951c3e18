"""Mutant of ex11: decodes with SDPA's is_causal over the valid slots: top-left alignment, so the
new token sees only the first cached position."""
import torch.nn.functional as F

from flashlib import flash_attention

EXPECTED_HINT = "bottom-right"


def attend(q, k, v, cache=None):
    if cache is None:
        return flash_attention(q, k, v, causal=True)
    prefill = max(cache.lengths) == 0
    cache.append(k, v)
    if prefill:
        return flash_attention(q, k, v, causal=True)
    L = max(cache.lengths)
    return F.scaled_dot_product_attention(q, cache.k[:, :, :L], cache.v[:, :, :L], is_causal=True,
                                          enable_gqa=True)
