"""Mutant of ex08b: a torch one-liner behind the kernel. dkdv_kernel's body is the stub's with
the raise removed (it computes nothing), and its ``run`` (what ``kernel[grid](...)`` calls) is
replaced by dK and dV from torch autograd in float64 on the tensors it is given: every result
is right, no Triton program runs. A grader that launches ``kernel[grid]`` itself passes it."""
EXPECTED_HINT = "does not run its body"

import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)


@triton.jit
def dkdv_kernel(Q, K, V, dO, Lse, Delta, dK, dV,
                stride_qb, stride_qh, stride_qm,
                stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn,
                stride_dob, stride_doh, stride_dom,
                stride_dkb, stride_dkh, stride_dkn,
                stride_dvb, stride_dvh, stride_dvn,
                Hkv, Nq, Nk, D, scale, GROUP,
                CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dK and dV of key block ``tl.program_id(0)`` of (batch, K/V head) ``tl.program_id(1)``.

    Q, dO (B, Hkv * GROUP, Nq, D); K, V, dK, dV (B, Hkv, Nk, D): pointers to element [0, 0, 0, 0];
    stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches, heads and rows of
    tensor x (its last dim is contiguous). Lse (natural log; -inf on a row that sees no key) and
    Delta (rowsum(dO * O)): contiguous (B, Hkv * GROUP, Nq) float32. scale: the softmax scale.
    BLOCK_D: a power of two >= D. Writes dK[b, hkv, rows] and dV[b, hkv, rows] for this block's
    rows < Nk (summed over the GROUP query heads of K/V head hkv); reads and writes nothing else.
    """
    # BEGIN SOLUTION
    pass
    # END SOLUTION


def attention_backward_dkdv(q, k, v, out, dout, lse, *, causal=False, scale=None, block_m=64,
                            block_n=64, num_warps=4, num_stages=2, kernel=dkdv_kernel):
    """Launch ``kernel`` (yours by default): returns ``(dk, dv)``, attention's gradients.

    q, out, dout: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 and D <= 256, last dim
    contiguous; lse: (B, Hq, Nq) from the forward (natural log, e.g. ``flashlib.flash_attention(
    ..., return_lse=True)`` or exercise 07b's ``attention_forward``). delta = rowsum(dout * out)
    is computed here, in float32. dk, dv: like k, v.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Nk, D) or v.shape != k.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, Hq, Nq, D) and (B, Hkv, Nk, D) with Hq % Hkv == 0")
    if any(t.stride(-1) != 1 for t in (q, k, v, dout)):
        raise ValueError("q, k, v and dout need a contiguous last dim (stride 1)")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    lse = lse.float().contiguous()
    delta = (dout.float() * out.float()).sum(-1).contiguous()                  # (B, Hq, Nq)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if B * Hkv > 65535:  # CUDA caps grid axes 1 and 2
        raise ValueError(f"batch x heads_kv = {B * Hkv} exceeds 65535, the grid's axis-1 limit")
    kernel[(triton.cdiv(Nk, block_n), B * Hkv)](
        q, k, v, dout, lse, delta, dk, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *dout.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], Hkv, Nq, Nk, D, scale, Hq // Hkv,
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(D)), DOT_PRECISION="ieee",
        num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return dk, dv


def _torch_dkdv_kernel(q, k, v, do, lse, delta, *outs, grid, warmup, CAUSAL, **kwargs):
    """dkdv_kernel's launch replaced: the same gradients from torch autograd in float64 (grouped heads,
    bottom-right causal, 0 for rows with no key), whatever the grid."""
    if warmup:
        return
    scale = outs[-2]
    with torch.enable_grad():   # also where autograd's backward calls the launch
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        group = q.shape[1] // k.shape[1]
        kk, vv = (t.repeat_interleave(group, dim=1) for t in leaves[1:])
        s = leaves[0] @ kk.transpose(-1, -2) * scale
        if CAUSAL:
            Nq, Nk = q.shape[2], k.shape[2]
            seen = torch.arange(Nk, device=q.device) <= torch.arange(Nq, device=q.device)[:, None] + Nk - Nq
            s = s.masked_fill(~seen, float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        e = torch.exp(s - torch.where(torch.isinf(m), 0.0, m))
        total = e.sum(dim=-1, keepdim=True)
        out = e / torch.where(total == 0, 1.0, total) @ vv
        grads = torch.autograd.grad(out, leaves, do.double())
    for dst, g in zip([t for t in outs if isinstance(t, torch.Tensor)], grads[1:]):
        dst.copy_(g.to(dst.dtype))


dkdv_kernel.run = _torch_dkdv_kernel
