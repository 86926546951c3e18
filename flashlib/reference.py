"""The one oracle: exact softmax attention in float64, returning the output and the lse.

Every kernel, NumPy algorithm and exercise in the course is checked against ``attention_ref``.
It is the textbook formula, S = scale * Q K^T, P = softmax(S), O = P V (FlashAttention paper,
section 2.2), computed in float64 in chunks of query rows so that real sizes fit in memory.

Conventions shared by the whole library:
- layout (batch, heads, seqlen, headdim), as torch's scaled_dot_product_attention;
- grouped-query heads: k and v may have heads_kv heads with heads_q % heads_kv == 0; query head
  h reads key/value head h // (heads_q // heads_kv);
- ``causal`` is bottom-right aligned, as in flash-attn: query i sees key j iff
  j <= i + seqlen_k - seqlen_q. With seqlen_q=2, seqlen_k=4 (x = attends)::

      bottom-right (flashlib)    top-left (SDPA is_causal)
          x x x .                    x . . .
          x x x x                    x x . .

- score modifiers (``modify_scores``) act on the scaled scores before the mask: the logit softcap
  ``softcap * tanh(s / softcap)`` (Gemma 2), then ALiBi's bias ``-slope_h * |i + Nk - Nq - j|``;
- a row with nothing to attend to returns zeros and lse = -inf, never NaN.
"""
import math

import numpy as np
import torch

from .inputs import check_qkv, resolve_scale

CHUNK_ELEMENTS = 1 << 26  # score-matrix elements per chunk of query rows (512 MiB in float64)


def causal_mask(seqlen_q: int, seqlen_k: int, device=None) -> torch.Tensor:
    """Bottom-right causal mask, (seqlen_q, seqlen_k) bool, True where query i may see key j."""
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    return j <= i + (seqlen_k - seqlen_q)


def modify_scores(s, q_pos, *, softcap=None, alibi_slopes=None):
    """The score modifiers on scaled scores s (B, Hq, rows, Nk): the softcap, then ALiBi's bias.

    q_pos: (rows,) the rows' positions on the key axis (query i of Nq is at i + Nk - Nq, as in
    the kernels' hook, ``flashlib.kernels.score_mod``). softcap: a positive float or None.
    alibi_slopes: (Hq,) or (B, Hq), or None; key j gets the bias ``-slope * |q_pos - j|``.
    """
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = torch.as_tensor(alibi_slopes, dtype=s.dtype, device=s.device)
        slopes = slopes.reshape(-1 if slopes.ndim == 2 else 1, slopes.shape[-1], 1, 1)  # (B|1, Hq, 1, 1)
        j = torch.arange(s.shape[-1], device=s.device)
        s = s - slopes * (q_pos.to(s.device)[:, None] - j[None, :]).abs()             # (.., rows, Nk)
    return s


def attention_ref(q, k, v, *, causal=False, scale=None, mask=None, softcap=None, alibi_slopes=None):
    """Exact attention in float64. Returns ``(out, lse)``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0. torch tensors or NumPy arrays
    (the result is of the same kind, float64, on q's device).
    causal: bottom-right aligned (see the module docstring). scale: defaults to 1/sqrt(D).
    mask: optional bool, broadcastable to (B, Hq, Nq, Nk); True where a query may attend a key.
    softcap, alibi_slopes: score modifiers, see ``modify_scores``.
    Returns out (B, Hq, Nq, D) and lse (B, Hq, Nq) = logsumexp of the scaled, masked scores
    (natural log); a row with no key to attend to has out = 0 and lse = -inf.
    """
    is_numpy = isinstance(q, np.ndarray)
    if is_numpy:
        q, k, v = (torch.from_numpy(np.ascontiguousarray(t)) for t in (q, k, v))
        if mask is not None:
            mask = torch.from_numpy(np.ascontiguousarray(mask))
    B, Hq, Hkv, Nq, Nk, D = check_qkv(q, k, v)
    scale = resolve_scale(scale, D)
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    group = Hq // Hkv
    k = k.repeat_interleave(group, dim=1)  # (B, Hq, Nk, D)
    v = v.repeat_interleave(group, dim=1)  # (B, Hq, Nk, D)
    if mask is not None:
        mask = torch.as_tensor(mask, device=q.device)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
        mask = mask.broadcast_to(B, Hq, Nq, Nk)

    out = torch.empty(B, Hq, Nq, D, dtype=torch.float64, device=q.device)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float64, device=q.device)
    rows = max(1, CHUNK_ELEMENTS // max(1, B * Hq * Nk))
    for start in range(0, Nq, rows):
        stop = min(Nq, start + rows)
        s = torch.matmul(q[:, :, start:stop], k.transpose(-1, -2)) * scale  # (B, Hq, n, Nk)
        s = modify_scores(s, torch.arange(start, stop) + (Nk - Nq), softcap=softcap,
                          alibi_slopes=alibi_slopes)
        allowed = torch.ones_like(s, dtype=torch.bool)
        if causal:
            allowed = allowed & causal_mask(Nq, Nk, q.device)[start:stop]
        if mask is not None:
            allowed = allowed & mask[:, :, start:stop]
        s = s.masked_fill(~allowed, -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)                           # (B, Hq, n), -inf if empty
        finite = torch.isfinite(row_lse)[..., None]
        p = torch.where(finite, torch.exp(s - row_lse[..., None]), 0.0)  # (B, Hq, n, Nk)
        out[:, :, start:stop] = torch.matmul(p, v)                     # (B, Hq, n, D)
        lse[:, :, start:stop] = row_lse
    if is_numpy:
        return out.numpy(), lse.numpy()
    return out, lse


def attention_naive(q, k, v, *, causal=False, scale=None, mask=None, softcap=None, alibi_slopes=None):
    """Textbook attention in the inputs' own dtype (the baseline for tolerances and benchmarks).

    Materialises the (B, Hq, Nq, Nk) score matrix: O(N^2) memory. Same conventions (``mask``,
    ``softcap``, ``alibi_slopes``) as ``attention_ref``; returns out only.
    """
    B, Hq, Hkv, Nq, Nk, D = check_qkv(q, k, v)
    scale = resolve_scale(scale, D)
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale                  # (B, Hq, Nq, Nk)
    s = modify_scores(s, torch.arange(Nq) + (Nk - Nq), softcap=softcap, alibi_slopes=alibi_slopes)
    if causal:
        s = s.masked_fill(~causal_mask(Nq, Nk, q.device), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                     # empty rows -> 0
    return torch.matmul(p, v)                                          # (B, Hq, Nq, D)
