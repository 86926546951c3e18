"""Mutant of ex08c: a torch one-liner behind the kernel. dq_kernel's body is the stub's with the
raise removed (it computes nothing), and its ``run`` (what ``kernel[grid](...)`` calls) is
replaced by dQ from torch autograd in float64 on the tensors it is given;
FlashAttentionFn is the solution's: every result is right, no Triton program runs. A grader that
launches ``kernel[grid]`` itself passes it."""
EXPECTED_HINT = "does not run its body"

import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)


@triton.jit
def dq_kernel(Q, K, V, dO, Lse, Delta, dQ,
              stride_qb, stride_qh, stride_qm,
              stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn,
              stride_dob, stride_doh, stride_dom,
              stride_dqb, stride_dqh, stride_dqm,
              Hq, Nq, Nk, D, scale, GROUP,
              CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dQ of query block ``tl.program_id(0)`` of (batch, query head) ``tl.program_id(1)``.

    Q, dO, dQ (B, Hq, Nq, D); K, V (B, Hq // GROUP, Nk, D): pointers to element [0, 0, 0, 0];
    stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches, heads and rows of
    tensor x (its last dim is contiguous). Lse (natural log; -inf on a row that sees no key) and
    Delta (rowsum(dO * O)): contiguous (B, Hq, Nq) float32. scale: the softmax scale.
    BLOCK_D: a power of two >= D. Writes dQ[b, h, rows] for this block's rows < Nq; reads and
    writes nothing else.
    """
    # BEGIN SOLUTION
    pass
    # END SOLUTION


def attention_backward_dq(q, k, v, dout, lse, delta, *, causal=False, scale=None, block_m=64,
                          block_n=64, num_warps=4, num_stages=2, kernel=dq_kernel):
    """Launch ``kernel`` (yours by default): returns dq, attention's gradient for q (like q).

    q, dout: (B, Hq, Nq, D) of one dtype; k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 and D <= 256,
    last dims contiguous; lse: (B, Hq, Nq) from the forward (natural log); delta: (B, Hq, Nq),
    rowsum(dout * out) in float32. scale None means 1/sqrt(D).
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Nk, D) or v.shape != k.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, Hq, Nq, D) and (B, Hkv, Nk, D) with Hq % Hkv == 0")
    if dout.shape != q.shape or dout.dtype != q.dtype:
        raise ValueError(f"dout {tuple(dout.shape)} {dout.dtype}: expected q's shape and dtype "
                         f"{tuple(q.shape)} {q.dtype}")
    for name, t in (("lse", lse), ("delta", delta)):
        if t.shape != (B, Hq, Nq):
            raise ValueError(f"{name} has shape {tuple(t.shape)}: expected (B, Hq, Nq) = {(B, Hq, Nq)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dim (stride 1), got strides "
                             f"{tuple(t.stride())}: pass {name}.contiguous()")
    if B * Hq > 65535:  # CUDA caps grid axes 1 and 2
        raise ValueError(f"batch x heads_q = {B * Hq} exceeds 65535, the grid's axis-1 limit")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    lse, delta = lse.float().contiguous(), delta.float().contiguous()
    dq = torch.empty_like(q)
    kernel[(triton.cdiv(Nq, block_m), B * Hq)](
        q, k, v, dout, lse, delta, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *dout.stride()[:3], *dq.stride()[:3], Hq, Nq, Nk, D, scale, Hq // Hkv,
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(D)), DOT_PRECISION="ieee",
        num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return dq


class FlashAttentionFn(torch.autograd.Function):
    """Attention whose backward is FlashAttention-2's: saves q, k, v, out, lse; recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, forward, backward_dkdv):
        """Run ``forward`` on q, k, v (made last-dim contiguous), save what the backward needs
        and return out."""
        # BEGIN SOLUTION
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        out, lse = forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.backward_dkdv = causal, scale, backward_dkdv
        return out
        # END SOLUTION

    @staticmethod
    def backward(ctx, dout):
        """dout (like out) -> (dq, dk, dv, None, None, None, None)."""
        # BEGIN SOLUTION
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()                       # autograd's may be expanded (stride 0)
        delta = (dout.float() * out.float()).sum(-1)   # (B, Hq, Nq)
        dq = attention_backward_dq(q, k, v, dout, lse, delta, causal=ctx.causal, scale=ctx.scale)
        dk, dv = ctx.backward_dkdv(q, k, v, out, dout, lse, causal=ctx.causal, scale=ctx.scale)
        return dq, dk, dv, None, None, None, None
        # END SOLUTION


def attention(q, k, v, *, causal=False, scale=None, forward, backward_dkdv):
    """``FlashAttentionFn.apply`` with keywords: attention's output, differentiable."""
    return FlashAttentionFn.apply(q, k, v, causal, scale, forward, backward_dkdv)


def _torch_dq_kernel(q, k, v, do, lse, delta, *outs, grid, warmup, CAUSAL, **kwargs):
    """dq_kernel's launch replaced: the same gradients from torch autograd in float64 (grouped heads,
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
    for dst, g in zip([t for t in outs if isinstance(t, torch.Tensor)], grads[:1]):
        dst.copy_(g.to(dst.dtype))


dq_kernel.run = _torch_dq_kernel
