"""Mutant of ex08c: the backward computes dq with torch from the saved tensors (P materialised), not
with the kernel."""
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime

EXPECTED_HINT = 'the backward must compute dq with your kernel'

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
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // Hq
    off_h = off_bh % Hq
    off_hkv = off_h // GROUP                                                  # its K/V head
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                          # (BM,) query rows
    offs_d = tl.arange(0, BLOCK_D)                                            # (BD,)
    q_ok = (offs_m[:, None] < Nq) & (offs_d[None, :] < D)                     # (BM, BD)
    q = tl.load(Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
                + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_ok, other=0.0)
    do = tl.load(dO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
                 + offs_m[:, None] * stride_dom + offs_d[None, :], mask=q_ok, other=0.0)
    row0 = off_bh.to(tl.int64) * Nq                                           # Lse and Delta
    lse = tl.load(Lse + row0 + offs_m, mask=offs_m < Nq, other=0.0)           # (BM,)
    delta = tl.load(Delta + row0 + offs_m, mask=offs_m < Nq, other=0.0)       # (BM,)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E

    hi = Nk
    if CAUSAL:  # the block's last row sees keys up to pid_m * BLOCK_M + BLOCK_M - 1 + Nk - Nq
        hi = tl.minimum(tl.maximum(pid_m * BLOCK_M + BLOCK_M + Nk - Nq, 0), Nk)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)                              # (BN,)
        kv_ok = (offs_n[:, None] < Nk) & (offs_d[None, :] < D)                # (BN, BD)
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BM, BN) base 2
        visible = (offs_m[:, None] < Nq) & (offs_n[None, :] < Nk)             # (BM, BN)
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + Nk - Nq)
        p = tl.where(visible, tl.math.exp2(s - lse[:, None] * LOG2E), 0.0)    # (BM, BN)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)           # (BM, BN)
        ds = p * (dp - delta[:, None])                                        # (BM, BN)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)     # (BM, BD)
    dq = dq * scale
    tl.store(dQ + off_b.to(tl.int64) * stride_dqb + off_h.to(tl.int64) * stride_dqh
             + offs_m[:, None] * stride_dqm + offs_d[None, :], dq.to(dQ.dtype.element_ty), mask=q_ok)


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
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        out, lse = forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.backward_dkdv = causal, scale, backward_dkdv
        return out

    @staticmethod
    def backward(ctx, dout):
        """dout (like out) -> (dq, dk, dv, None, None, None, None)."""
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()                       # autograd's may be expanded (stride 0)
        delta = (dout.float() * out.float()).sum(-1)   # (B, Hq, Nq)
        G = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(G, 1).float(), v.repeat_interleave(G, 1).float()
        scale = 1.0 / math.sqrt(q.shape[-1]) if ctx.scale is None else ctx.scale
        s = scale * q.float() @ kk.transpose(-1, -2)                        # (B, Hq, Nq, Nk)
        if ctx.causal:
            Nq, Nk = q.shape[2], k.shape[2]
            keep = torch.arange(Nk)[None, :] <= torch.arange(Nq)[:, None] + Nk - Nq
            s = s.masked_fill(~keep.to(s.device), float('-inf'))
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        ds = p * (dout.float() @ vv.transpose(-1, -2) - delta[..., None])
        dq = (scale * ds @ kk).to(q.dtype)
        dk, dv = ctx.backward_dkdv(q, k, v, out, dout, lse, causal=ctx.causal, scale=ctx.scale)
        return dq, dk, dv, None, None, None, None


def attention(q, k, v, *, causal=False, scale=None, forward, backward_dkdv):
    """``FlashAttentionFn.apply`` with keywords: attention's output, differentiable."""
    return FlashAttentionFn.apply(q, k, v, causal, scale, forward, backward_dkdv)
