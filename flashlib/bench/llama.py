"""A Llama-style decoder for the model suite: RMSNorm, rotary positions, grouped-query attention
and a SwiGLU MLP (Touvron et al., 2023, "Llama 2"), in nanoGPT's layout.

The model suite (``flashlib.bench.model``) times a training step of it at the widths a modern LLM
trains at (32 query heads over 8 K/V heads of dim 128, 4096 tokens), where attention is a larger
share of the step than in GPT-2 small. As in ``flashlib.teach.gpt``, attention is a function
passed in, ``attention(q, k, v, cache=None)`` -> (B, H, T, D), causal: the same weights run on
flashlib's kernels or on SDPA, nothing else changes.

Limits: training only (no KV cache, no ``generate``); rotary tables for ``block_size`` positions
built once; no dropout, no weight tying; the MLP's gate and up projections are one matmul.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    block_size: int = 4096      # longest sequence (rotary tables)
    n_layer: int = 4
    n_head: int = 32
    n_kv_head: int = 8
    n_embd: int = 4096          # n_head * head dim (128)
    ffn_hidden: int = 14336     # SwiGLU's hidden width
    rope_theta: float = 500000.0


def rotary_tables(T, D, theta):
    """cos, sin (T, D/2) of the angles position * theta^(-2i/D), float32."""
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)   # (D/2,)
    angles = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)    # (T, D/2)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """Rotary position embedding of x (B, H, T, D): each pair (x_i, x_{i+D/2}) turned by its angle.
    Computed in float32 (the tables' dtype), returned in x's."""
    x1, x2 = x.chunk(2, dim=-1)                                             # (B, H, T, D/2) each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.H, self.Hkv, self.D = cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head
        self.wqkv = nn.Linear(cfg.n_embd, (self.H + 2 * self.Hkv) * self.D, bias=False)
        self.wo = nn.Linear(self.H * self.D, cfg.n_embd, bias=False)
        self.attention = attention

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.wqkv(x).split([self.H * self.D, self.Hkv * self.D, self.Hkv * self.D], dim=-1)
        q = q.view(B, T, self.H, self.D).transpose(1, 2)          # (B, H, T, D)
        k = k.view(B, T, self.Hkv, self.D).transpose(1, 2)        # (B, Hkv, T, D)
        v = v.view(B, T, self.Hkv, self.D).transpose(1, 2)        # (B, Hkv, T, D)
        q, k = rotate(q, cos[:T], sin[:T]), rotate(k, cos[:T], sin[:T])
        y = self.attention(q, k, v)                               # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.H * self.D))   # (B, T, C)


class SwiGLU(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_up = nn.Linear(cfg.n_embd, 2 * cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)               # (B, T, F) each
        return self.down(F.silu(gate) * up)                       # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(cfg.n_embd, eps=1e-5), nn.RMSNorm(cfg.n_embd, eps=1e-5)
        self.attn, self.mlp = Attention(cfg, attention), SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """``Llama(cfg, attention=fn)``; ``forward(idx, targets=None)`` as ``teach.gpt.GPT``'s."""

    def __init__(self, cfg: LlamaConfig, *, attention):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.n_embd, eps=1e-5)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        cos, sin = rotary_tables(cfg.block_size, cfg.n_embd // cfg.n_head, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)        # (block_size, D/2)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        """idx (B, T) -> logits (B, T, vocab), and the mean cross-entropy against targets (B, T)."""
        x = self.tok_emb(idx)                                     # (B, T, C)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        logits = self.lm_head(self.norm(x))                       # (B, T, vocab)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
