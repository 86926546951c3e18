"""Mutant of ex10b: a torch one-liner behind the kernel. split_kv_kernel's body is the stub's with
the raise removed (it computes nothing), and its ``run`` (what ``kernel[grid](...)`` calls) is
replaced by the partials in torch on the tensors it is given (each sequence's [0, L) cut into
``num_splits`` runs of whole key blocks, bottom-right causal, grouped heads, 0 and -inf where a
row sees no key of its part): every result is right, no Triton program runs. A grader that
launches ``kernel[grid]`` itself passes it."""
EXPECTED_HINT = "does not run its body"
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime
from flashlib.kernels.decode import combine

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)    # ln(2): ln(x) = log2(x) * LN2


@triton.jit
def split_kv_kernel(Q, K, V, Seqlens, OPart, LsePart,
                    stride_qb, stride_qh, stride_qm,
                    stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn,
                    Hkv, Nq, Lmax, D, qk_scale, num_splits, GROUP,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Partial attention of split ``tl.program_id(0)`` of (batch, K/V head) ``tl.program_id(1)``.

    Q (B, Hkv * GROUP, Nq, D); K, V (B, Hkv, Lmax, D): pointers to element [0, 0, 0, 0];
    stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches, heads and rows of
    tensor x (its last dim is contiguous). Seqlens: int32 (B,), the valid cache positions of
    each sequence, 0 <= Seqlens[b] <= Lmax (the caches' allocated length). OPart: contiguous
    float32 (B, Hkv * GROUP, Nq, num_splits, D); LsePart: contiguous float32 (B, Hkv * GROUP,
    Nq, num_splits), natural log. qk_scale: softmax scale * log2(e). BLOCK_M: a power of two
    >= GROUP * Nq; BLOCK_D: a power of two >= D. Writes this split's partial output and lse for
    the group's GROUP * Nq rows (0 and -inf where it sees no key); reads no key or value at
    positions >= Seqlens[b]; writes nothing else.
    """
    pass


def split_kv_partials(q, k_cache, v_cache, cache_seqlens=None, *, num_splits=4, scale=None,
                      block_n=32, num_warps=4, num_stages=2, kernel=split_kv_kernel):
    """Launch ``kernel`` (yours by default): returns ``(o_part, lse_part)``, one result per split.

    q: (B, Hq, Nq, D) with Hq * Nq / Hkv <= 128 query rows per K/V head; k_cache, v_cache:
    (B, Hkv, Lmax, D) with Hq % Hkv == 0 and D <= 256, last dim contiguous; cache_seqlens: (B,)
    ints in [0, Lmax] (None: every sequence has Lmax). o_part: (B, Hq, Nq, num_splits, D)
    float32; lse_part: (B, Hq, Nq, num_splits) float32, natural log, -inf for an empty split.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Lmax = k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape != (B, Hkv, Lmax, D) or v_cache.shape != k_cache.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache "
                         f"{tuple(v_cache.shape)}: expected (B, Hq, Nq, D) and (B, Hkv, Lmax, D) "
                         "with Hq % Hkv == 0")
    if any(t.stride(-1) != 1 for t in (q, k_cache, v_cache)):
        raise ValueError("q, k_cache and v_cache need a contiguous last dim (stride 1)")
    rows = Hq // Hkv * Nq
    if rows > 128:
        raise ValueError(f"{rows} query rows per K/V head (heads_q / heads_kv x Nq): at most 128; "
                         "use flash_attention for a prefill")
    if cache_seqlens is None:
        cache_seqlens = torch.full((B,), Lmax, dtype=torch.int32, device=q.device)
    seqlens = cache_seqlens.to(device=q.device, dtype=torch.int32)
    if seqlens.shape != (B,) or (B and (int(seqlens.min()) < 0 or int(seqlens.max()) > Lmax)):
        raise ValueError(f"cache_seqlens must be {B} ints in [0, {Lmax}]")
    if B * Hkv > 65535:  # CUDA caps grid axes 1 and 2
        raise ValueError(f"batch x heads_kv = {B * Hkv} exceeds 65535, the grid's axis-1 limit")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    o_part = torch.empty((B, Hq, Nq, num_splits, D), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((B, Hq, Nq, num_splits), dtype=torch.float32, device=q.device)
    kernel[(num_splits, B * Hkv)](
        q, k_cache, v_cache, seqlens, o_part, lse_part, *q.stride()[:3], *k_cache.stride()[:3],
        *v_cache.stride()[:3], Hkv, Nq, Lmax, D, scale * math.log2(math.e), num_splits, Hq // Hkv,
        BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(D)), DOT_PRECISION="ieee",
        num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return o_part, lse_part


def split_kv_decode(q, k_cache, v_cache, cache_seqlens=None, *, num_splits=4, scale=None,
                    block_n=32, kernel=split_kv_kernel):
    """Flash-Decoding with your split kernel: ``split_kv_partials``, then flashlib's combine
    (exercise 10's merge, ``flashlib.kernels.decode.combine``). Returns ``(out, lse)``: out like
    q, lse (B, Hq, Nq) float32, natural log; like ``flashlib.flash_decode(..., return_lse=True)``."""
    o_part, lse_part = split_kv_partials(q, k_cache, v_cache, cache_seqlens, num_splits=num_splits,
                                         scale=scale, block_n=block_n, kernel=kernel)
    return combine(o_part, lse_part, out_dtype=q.dtype)


def _torch_partials(q, k, v, seqlens, o_part, lse_part, *args, grid, warmup, BLOCK_N, **kwargs):
    """split_kv_kernel's launch replaced: the same partials from torch, whatever the grid."""
    if warmup:
        return
    qk_scale, num_splits, group = args[-3], args[-2], args[-1]
    Nq = q.shape[2]
    for b, L in enumerate(seqlens.tolist()):
        chunk = -(-(-(-L // num_splits)) // BLOCK_N) * BLOCK_N
        kk, vv = (t[b, :, :L].double().repeat_interleave(group, dim=0) for t in (k, v))
        s = q[b].double() @ kk.transpose(-1, -2) * (qk_scale / LOG2E.value)   # (Hq, Nq, L)
        seen = torch.arange(L, device=q.device) <= torch.arange(Nq, device=q.device)[:, None] + L - Nq
        s = s.masked_fill(~seen, float("-inf"))
        for split in range(num_splits):
            lo, hi = min(split * chunk, L), min((split + 1) * chunk, L)
            m = torch.logsumexp(s[..., lo:hi], dim=-1)                      # -inf where none seen
            o = torch.exp(s[..., lo:hi] - m[..., None]).nan_to_num(0.0) @ vv[:, lo:hi]
            o_part[b, :, :, split] = o.float()
            lse_part[b, :, :, split] = m.float()


split_kv_kernel.run = _torch_partials
