"""Hostile (issue 55): a torch one-liner behind the kernel (tests/mutants/ex07b_torch_one_liner.py):
the bodies compute nothing and each kernel's ``run``, what ``kernel[grid](...)`` calls, is
torch on the tensors. Expected: 0 points (the grader runs each kernel's body from a harness
kernel of its own; in-process grading also names the replaced run)."""
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime
from flashlib.kernels.tile import LOG2E, tile_update

LN2 = tl.constexpr(0.6931471805599453)  # ln(2): ln(x) = log2(x) * LN2


@triton.jit
def fa2_kernel(Q, K, V, Out, Lse,
               stride_qb, stride_qh, stride_qm,
               stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn,
               stride_ob, stride_oh, stride_om,
               Hq, Nq, Nk, D, qk_scale, GROUP,
               CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """FA2 forward for query block ``tl.program_id(0)`` of (batch, head) ``tl.program_id(1)``.

    Q (B, Hq, Nq, D), K and V (B, Hq // GROUP, Nk, D), Out like Q: pointers to element
    [0, 0, 0, 0]; stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches,
    heads and rows of tensor x (its last dim is contiguous). Lse: contiguous (B, Hq, Nq) float32.
    qk_scale: softmax scale * log2(e). BLOCK_D: a power of two >= D. Writes Out[b, h, rows] and
    Lse[b, h, rows] for this block's rows < Nq (out 0 and lse -inf on rows with no visible key);
    reads and writes nothing else.
    """
    pass


def attention_forward(q, k, v, *, causal=False, scale=None, block_m=64, block_n=64,
                      num_warps=4, num_stages=2, kernel=fa2_kernel):
    """Launch ``kernel`` (yours by default): returns ``(out, lse)`` like ``flashlib.flash_attention``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 and D <= 256, last dim
    contiguous. out: like q; lse: (B, Hq, Nq) float32. One fixed block config (no autotuning):
    block_m x block_n, num_warps, num_stages (lesson 07 explains them).
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Nk, D) or v.shape != k.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, Hq, Nq, D) and (B, Hkv, Nk, D) with Hq % Hkv == 0")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("q, k and v need a contiguous last dim (stride 1)")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    if B * Hq > 65535:  # CUDA caps grid axes 1 and 2 (flashlib's kernels use one flat axis)
        raise ValueError(f"batch x heads_q = {B} x {Hq} = {B * Hq} exceeds 65535, the grid's "
                         "axis-1 limit of this exercise's launcher; use fewer sequences per call")
    kernel[grid](q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                 *out.stride()[:3], Hq, Nq, Nk, D, scale * LOG2E, Hq // Hkv,
                 CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
                 BLOCK_D=max(16, triton.next_power_of_2(D)),
                 DOT_PRECISION="ieee",
                 num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return out, lse


def _torch_attention(q, k, v, out, lse, *args, grid, warmup, CAUSAL, **kwargs):
    """fa2_kernel's launch replaced: the same out and lse from torch, whatever the grid."""
    if warmup:
        return
    qk_scale, group = args[-2], args[-1]
    Nq, Nk = q.shape[2], k.shape[2]
    kk, vv = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    s = q.double() @ kk.transpose(-1, -2) * (qk_scale / LOG2E)            # (B, Hq, Nq, Nk)
    if CAUSAL:
        seen = torch.arange(Nk, device=q.device) <= torch.arange(Nq, device=q.device)[:, None] + Nk - Nq
        s = s.masked_fill(~seen, float("-inf"))
    m = torch.logsumexp(s, dim=-1)                                        # -inf on empty rows
    out.copy_((torch.exp(s - m[..., None]).nan_to_num(0.0) @ vv).to(out.dtype))
    lse.copy_(m.float())


fa2_kernel.run = _torch_attention
