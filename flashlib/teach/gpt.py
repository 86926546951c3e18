"""A small GPT whose attention runs on flashlib's kernels: the model of lesson 11 (the capstone).

The network is GPT-2's decoder (Radford et al., 2019) in nanoGPT's layout: token and position
embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP, a final LayerNorm and
an output layer tied to the token embedding. Attention is where the course's kernels come in,
and ``attend`` is the one function that picks them:

- training: the whole sequence at once, ``flash_attention(q, k, v, causal=True)``, the
  FlashAttention-2 forward and backward of lessons 07-08 through autograd;
- sampling, prefill: the prompt goes through the same kernel, and its keys and values into one
  ``KVCache`` per layer;
- sampling, decode: each new token's key and value are appended to the cache and its query
  attends to every cached position with ``flash_decode`` (Flash-Decoding, lesson 10): O(L d)
  bytes read per token and layer, where recomputing the sequence costs O(L^2 d) FLOPs.

Grouped-query attention (``n_kv_head`` < ``n_head``) shares each cached K/V head among
``n_head / n_kv_head`` query heads, which shrinks the cache by that factor.

The data is characters: ``corpus()`` is flashlib's own source code, so the model learns to write
text that looks like this file and needs no download.

Limits: no dropout (the kernels have none); the model runs in its parameters' dtype, or under
``torch.autocast`` (bfloat16/float16 on a GPU; through the interpreter keep float32); the context
is at most ``block_size`` tokens, prompt and sampled tokens together.
"""
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..decode import KVCache
from ..ops import flash_attention


def attend(q, k, v, cache=None):
    """Causal self-attention of T new tokens, on flashlib's kernels.

    q: (B, Hq, T, D); k, v: (B, Hkv, T, D), Hq % Hkv == 0. Returns (B, Hq, T, D).
    cache None (training): the T tokens are the whole sequence.
    cache a ``KVCache`` (sampling): k, v are appended to it first; if it held nothing before, the
    T tokens are a prompt attending to itself (prefill), else they attend to every cached
    position, theirs included (decode, ``cache.attend``).
    """
    if cache is None:
        return flash_attention(q, k, v, causal=True)
    if max(cache.lengths) == 0:                      # the host copy: no device sync
        cache.append(k, v)
        return flash_attention(q, k, v, causal=True)
    return cache.attend(q, k, v)                     # append k, v, then attend


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 256        # longest context: prompt and sampled tokens together
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None  # None: one K/V head per query head
    n_embd: int = 128

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.H, self.Hkv, self.D = cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, (self.H + 2 * self.Hkv) * self.D, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.attention = attention

    def forward(self, x, cache=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split([self.H * self.D, self.Hkv * self.D, self.Hkv * self.D], dim=-1)
        q = q.view(B, T, self.H, self.D).transpose(1, 2)          # (B, H, T, D)
        k = k.view(B, T, self.Hkv, self.D).transpose(1, 2)        # (B, Hkv, T, D)
        v = v.view(B, T, self.Hkv, self.D).transpose(1, 2)        # (B, Hkv, T, D)
        y = self.attention(q, k, v, cache)                        # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))      # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg, attention)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """``GPT(cfg)``; ``attention`` replaces ``attend`` (same signature), e.g. a learner's own or
    one built on ``torch.nn.functional.scaled_dot_product_attention`` to compare against;
    ``kv_cache`` replaces the class ``new_caches`` builds (``KVCache``'s constructor and its
    ``lengths`` and ``append``), for an attention that reads its cache its own way."""

    def __init__(self, cfg: GPTConfig, *, attention=None, kv_cache=None):
        super().__init__()
        self.cfg = cfg
        attention = attend if attention is None else attention
        self.kv_cache = KVCache if kv_cache is None else kv_cache
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight                     # tied, as GPT-2
        for name, p in self.named_parameters():
            if p.dim() == 2:   # GPT-2's init; residual projections scaled by depth
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets=None, caches=None):
        """idx (B, T) token ids -> logits (B, T, vocab), and the mean cross-entropy against targets
        (B, T) if given. With ``caches`` (one ``KVCache`` per layer), idx are the next tokens of
        sequences whose earlier tokens are cached, as many for each sequence (``generate``'s
        case): positions continue from the caches' length."""
        B, T = idx.shape
        lengths = [0] if caches is None else caches[0].lengths
        if len(set(lengths)) > 1:
            raise ValueError(f"the caches hold sequences of lengths {lengths}: positions would differ "
                             "between sequences; GPT.forward needs them equal")
        start = lengths[0]
        if start + T > self.cfg.block_size:
            raise ValueError(f"{start + T} tokens exceed the context of block_size={self.cfg.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)   # (T,)
        x = self.wte(idx) + self.wpe(pos)                         # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        logits = self.lm_head(self.ln_f(x))                       # (B, T, vocab)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def new_caches(self, batch, max_len, *, dtype=None):
        """One empty ``KVCache`` (or ``kv_cache``) per layer; dtype: what k and v will be
        (default: the autocast dtype where autocast is on, else the parameters')."""
        device = self.wte.weight.device
        if dtype is None:
            dtype = (torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type)
                     else self.wte.weight.dtype)
        cfg = self.cfg
        return [self.kv_cache(batch, cfg.n_kv_head, max_len, cfg.n_embd // cfg.n_head, dtype=dtype,
                              device=device) for _ in range(cfg.n_layer)]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, *, temperature=1.0, top_k=None, use_cache=True,
                 generator=None):
        """Sample ``max_new_tokens`` tokens after the prompts idx (B, T0); returns (B, T0 + n).

        use_cache: prefill once, then one token per step against the caches (flash_decode);
        False recomputes attention over the whole sequence at every step (the slow way, to
        compare). temperature divides the logits; top_k keeps the k likeliest tokens."""
        B, T0 = idx.shape
        if T0 + max_new_tokens > self.cfg.block_size:
            raise ValueError(f"the prompt ({T0}) and max_new_tokens ({max_new_tokens}) exceed "
                             f"block_size={self.cfg.block_size}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        caches = self.new_caches(B, T0 + max_new_tokens) if use_cache else None
        logits, _ = self(idx, caches=caches)                      # prefill: (B, T0, vocab)
        for step in range(max_new_tokens):
            last = logits[:, -1].float() / temperature            # (B, vocab)
            if top_k is not None:
                kth = torch.topk(last, min(top_k, last.shape[-1])).values[:, -1:]
                last = last.masked_fill(last < kth, float("-inf"))
            nxt = torch.multinomial(F.softmax(last, dim=-1), 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)                    # (B, T0 + step + 1)
            if step + 1 < max_new_tokens:
                logits, _ = self(nxt, caches=caches) if use_cache else self(idx)
        return idx


def corpus() -> str:
    """flashlib's own source code, every ``.py`` file of the package in a fixed order."""
    root = Path(__file__).resolve().parents[1]   # flashlib/
    return "\n".join(p.read_text() for p in sorted(root.rglob("*.py")))


class CharTokenizer:
    """Characters to ids and back; the vocabulary is the characters of ``text``."""

    def __init__(self, text):
        self.chars = sorted(set(text))
        self._ids = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text) -> torch.Tensor:
        unknown = sorted(set(text) - self._ids.keys())
        if unknown:
            raise ValueError(f"characters outside the vocabulary: {unknown[:10]!r}")
        return torch.tensor([self._ids[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in torch.as_tensor(ids).tolist())


def batches(data, batch_size, block_size, *, generator=None, device=None):
    """Endless (inputs, targets) pairs of random windows of ``data`` (1-D ids): (B, T) each,
    targets the inputs shifted by one token."""
    if data.numel() <= block_size:
        raise ValueError(f"data has {data.numel()} tokens; need more than block_size={block_size}")
    while True:
        starts = torch.randint(data.numel() - block_size, (batch_size,), generator=generator)
        x = torch.stack([data[s:s + block_size] for s in starts.tolist()])       # (B, T)
        y = torch.stack([data[s + 1:s + 1 + block_size] for s in starts.tolist()])
        yield x.to(device), y.to(device)
