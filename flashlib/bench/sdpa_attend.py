"""The SDPA baseline of the model suite: ``teach.gpt.attend``'s contract on
``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's default dispatch), with the
preallocated KV cache a user of SDPA would write.

``GPT(cfg, attention=sdpa_attend, kv_cache=SDPACache)`` is the capstone's model with nothing
changed but attention: training and the prompt (prefill) go through SDPA with ``is_causal``, each
new token's query attends to the cache's first ``length`` positions. The cache is allocated once
per ``generate`` call (like ``KVCache``) and written in place, one slice per token and layer.

Limits: every sequence of a batch has the same length; after the prefill, one token at a time
(SDPA's ``is_causal`` is aligned top-left, wrong for a chunk after a cached prefix).
"""
import torch
import torch.nn.functional as F


class SDPACache:
    """A preallocated KV cache for SDPA: k, v (batch, heads_kv, max_len, headdim) and one length
    on the host (every sequence alike, as ``GPT.generate`` keeps them); ``KVCache``'s constructor."""

    def __init__(self, batch, heads_kv, max_len, headdim, *, dtype, device):
        self.k = torch.zeros(batch, heads_kv, max_len, headdim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @property
    def lengths(self):
        return [self.length] * self.k.shape[0]

    def append(self, k_new, v_new):
        n = k_new.shape[2]
        self.k[:, :, self.length:self.length + n] = k_new          # (B, Hkv, n, D)
        self.v[:, :, self.length:self.length + n] = v_new
        self.length += n


def sdpa_attend(q, k, v, cache=None):
    """``teach.gpt.attend`` on SDPA (default dispatch): causal training and prefill, then one new
    token at a time against the first ``cache.length`` positions of the cache."""
    gqa = q.shape[1] != k.shape[1]
    if cache is None or cache.length == 0:
        if cache is not None:
            cache.append(k, v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if q.shape[2] != 1:   # SDPA's is_causal is top-left aligned: wrong for a chunk after a prefix
        raise ValueError(f"sdpa_attend decodes one token at a time, got {q.shape[2]}")
    cache.append(k, v)
    n = cache.length
    return F.scaled_dot_product_attention(q, cache.k[:, :, :n], cache.v[:, :, :n], enable_gqa=gqa)
