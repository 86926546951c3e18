"""Lesson 13's score-modifier hook in PyTorch: a tiled attention whose scores pass through ``mod``.

FlexAttention's ``score_mod`` idea and flashlib's ``SCORE_MOD`` hook (``flashlib/kernels/
score_mod.py``), written in PyTorch so that a learner's modifier plugs into a readable forward and
backward without touching a kernel. A modifier is a function

    mod(s, q_pos, k_pos, head) -> (s_new, ds_new_ds)

of a tile of scaled scores ``s`` (B, H, bm, bn), natural-log units; ``q_pos`` (bm,) and ``k_pos``
(bn,), int64, the positions of the tile's queries and keys on the key axis (query i of Nq is at
``i + Nk - Nq``, bottom-right, as flashlib's causal mask); ``head`` (H,), int64, the query heads.
It returns the new scores and their derivative with respect to ``s`` (broadcastable to ``s``).

``tiled_attention`` is FlashAttention-2's forward (lesson 04): query blocks outer, key blocks
inner, the modifier applied to each tile before the causal mask and the online softmax; it returns
(out, lse). ``tiled_attention_backward`` recomputes each tile from lse (lesson 08) and multiplies
dS by the modifier's derivative before it reaches dQ and dK: the chain rule through the hook.
``ModifiedAttention`` ties the two into an autograd.Function.

Limits: Hq == Hkv (no grouped heads), float32 or float64, CPU or GPU through plain PyTorch (no
kernel): for exercises and checks at small sizes, not for speed.
"""
import math

import torch

__all__ = ["ModifiedAttention", "identity", "tiled_attention", "tiled_attention_backward"]


def identity(s, q_pos, k_pos, head):
    """The modifier that changes nothing: derivative 1."""
    return s, torch.ones((), dtype=s.dtype, device=s.device)


def _tile(q, k, scale, mod, rows, cols, Nq, Nk, causal):
    """Scores of one tile after the modifier and the mask: (s_new, ds) each (B, H, bm, bn)."""
    H = q.shape[1]
    q_pos = torch.arange(rows.start, rows.stop, device=q.device) + (Nk - Nq)     # (bm,)
    k_pos = torch.arange(cols.start, cols.stop, device=q.device)                 # (bn,)
    s = q[:, :, rows] @ k[:, :, cols].transpose(-1, -2) * scale                  # (B, H, bm, bn)
    s_new, ds = mod(s, q_pos, k_pos, torch.arange(H, device=q.device))
    if causal:
        s_new = s_new.masked_fill(k_pos[None, :] > q_pos[:, None], -math.inf)
    return s_new, torch.broadcast_to(ds, s.shape)


def tiled_attention(q, k, v, mod=identity, *, causal=False, scale=None, block=16):
    """Attention with the modifier ``mod`` applied to every tile of scores. q (B, H, Nq, D),
    k, v (B, H, Nk, D). Returns out (like q) and lse (B, H, Nq), natural log, -inf and out 0 on a
    row with no visible key."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros_like(q)
    lse = torch.full((B, H, Nq), -math.inf, dtype=q.dtype, device=q.device)
    for i in range(0, Nq, block):
        rows = slice(i, min(i + block, Nq))
        m = torch.full((B, H, rows.stop - i), -math.inf, dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(B, H, rows.stop - i, D, dtype=q.dtype, device=q.device)
        for j in range(0, Nk, block):
            cols = slice(j, min(j + block, Nk))
            s, _ = _tile(q, k, scale, mod, rows, cols, Nq, Nk, causal)           # (B, H, bm, bn)
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isneginf(m_new), 0.0, m_new)               # empty so far
            p = torch.exp(s - safe[..., None])
            alpha = torch.exp(m - safe)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + p @ v[:, :, cols]
            m = m_new
        seen = l > 0
        out[:, :, rows] = torch.where(seen[..., None], acc / torch.where(seen, l, 1.0)[..., None], 0.0)
        lse[:, :, rows] = torch.where(seen, m + torch.log(torch.where(seen, l, 1.0)), -math.inf)
    return out, lse


def tiled_attention_backward(q, k, v, out, lse, dout, mod=identity, *, causal=False, scale=None,
                             block=16):
    """dq, dk, dv of ``tiled_attention``: P recomputed from lse, dS = P (dP - delta) on the
    modified scores, times the modifier's derivative for the raw scores (the chain rule)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (dout * out).sum(-1)                                                 # (B, H, Nq)
    safe_lse = torch.where(torch.isneginf(lse), 0.0, lse)
    for i in range(0, Nq, block):
        rows = slice(i, min(i + block, Nq))
        for j in range(0, Nk, block):
            cols = slice(j, min(j + block, Nk))
            s, ds = _tile(q, k, scale, mod, rows, cols, Nq, Nk, causal)          # (B, H, bm, bn)
            p = torch.exp(s - safe_lse[:, :, rows, None])                        # 0 where masked
            dv[:, :, cols] += p.transpose(-1, -2) @ dout[:, :, rows]
            dp = dout[:, :, rows] @ v[:, :, cols].transpose(-1, -2)
            d_raw = p * (dp - delta[:, :, rows, None]) * torch.where(p > 0, ds, 0.0)
            dq[:, :, rows] += d_raw @ k[:, :, cols] * scale
            dk[:, :, cols] += d_raw.transpose(-1, -2) @ q[:, :, rows] * scale
    return dq, dk, dv


class ModifiedAttention(torch.autograd.Function):
    """``tiled_attention`` as one autograd node: saves q, k, v, out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, mod, causal, scale, block):
        out, lse = tiled_attention(q, k, v, mod, causal=causal, scale=scale, block=block)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mod, ctx.causal, ctx.scale, ctx.block = mod, causal, scale, block
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, dout, ctx.mod, causal=ctx.causal,
                                              scale=ctx.scale, block=ctx.block)
        return dq, dk, dv, None, None, None, None
