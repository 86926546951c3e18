"""Mutant of ex08b: grouped-query: the query heads of K/V head hkv taken as g * Hkv + hkv
(interleaved) instead of hkv * GROUP + g."""
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime

EXPECTED_HINT = 'grouped heads'

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
    pid_n = tl.program_id(0)
    off_bkv = tl.program_id(1)
    off_b = off_bkv // Hkv
    off_hkv = off_bkv % Hkv
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                          # (BN,) key rows
    offs_d = tl.arange(0, BLOCK_D)                                            # (BD,)
    kv_ok = (offs_n[:, None] < Nk) & (offs_d[None, :] < D)                    # (BN, BD)
    k = tl.load(K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
                + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
                + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * LOG2E

    lo = 0
    if CAUSAL:  # query rows i < first key - (Nk - Nq) see none of this block's keys
        lo = tl.maximum(pid_n * BLOCK_N - (Nk - Nq), 0) // BLOCK_M * BLOCK_M
    for g in range(GROUP):                        # the query heads that share this K/V head
        off_h = g * Hkv + off_hkv
        q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        do_base = dO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
        row0 = (off_b.to(tl.int64) * Hkv * GROUP + off_h) * Nq                # Lse and Delta
        for start_m in range(lo, Nq, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)                          # (BM,)
            q_ok = (offs_m[:, None] < Nq) & (offs_d[None, :] < D)             # (BM, BD)
            q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_ok, other=0.0)
            do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], mask=q_ok, other=0.0)
            lse = tl.load(Lse + row0 + offs_m, mask=offs_m < Nq, other=0.0)   # (BM,)
            delta = tl.load(Delta + row0 + offs_m, mask=offs_m < Nq, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BM, BN) base 2
            visible = (offs_m[:, None] < Nq) & (offs_n[None, :] < Nk)         # (BM, BN)
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + Nk - Nq)
            p = tl.where(visible, tl.math.exp2(s - lse[:, None] * LOG2E), 0.0)   # (BM, BN)
            dv = tl.dot(tl.trans(p).to(do.dtype), do, dv, input_precision=DOT_PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)          # (BM, BN)
            ds = p * (dp - delta[:, None])                                       # (BM, BN)
            dk = tl.dot(tl.trans(ds).to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    dk = dk * scale
    tl.store(dK + off_b.to(tl.int64) * stride_dkb + off_hkv.to(tl.int64) * stride_dkh
             + offs_n[:, None] * stride_dkn + offs_d[None, :], dk.to(dK.dtype.element_ty), mask=kv_ok)
    tl.store(dV + off_b.to(tl.int64) * stride_dvb + off_hkv.to(tl.int64) * stride_dvh
             + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(dV.dtype.element_ty), mask=kv_ok)


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
