"""Mutant of ex07b: the running max starts at 0 (tl.zeros, like acc and l_i) instead of -inf: the
max of a row whose scores are all below 0 stays 0, which is harmless for ordinary scores (p is
merely rescaled) and for rows with no key, but where every score lies far below 0 (below -126 in
base 2) every exp2(s - 0) underflows to 0 and the row comes out empty (out 0, lse -inf)."""
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime
from flashlib.kernels.tile import LOG2E, tile_update

EXPECTED_HINT = 'start the running max at -inf'

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
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // Hq
    off_h = off_bh % Hq
    off_hkv = off_h // GROUP                           # grouped-query: GROUP heads share K/V
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)   # (BM,) this block's query rows
    offs_n = tl.arange(0, BLOCK_N)                     # (BN,)
    offs_d = tl.arange(0, BLOCK_D)                     # (BD,)
    d_ok = offs_d < D                                  # (BD,) the padded head dims are masked

    # batch and head offsets in int64: b * stride_b passes 2**31 elements on large inputs
    q_ptrs = (Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
              + offs_m[:, None] * stride_qm + offs_d[None, :])                  # (BM, BD)
    kt_ptrs = (K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
               + offs_n[None, :] * stride_kn + offs_d[:, None])                 # (BD, BN): K^T
    v_ptrs = (V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
              + offs_n[:, None] * stride_vn + offs_d[None, :])                  # (BN, BD)
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < Nq) & d_ok[None, :], other=0.0)  # (BM, BD)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    hi = Nk
    if CAUSAL:  # key blocks past the last row's diagonal are never loaded
        hi = tl.minimum(Nk, tl.maximum(0, (pid_m + 1) * BLOCK_M + Nk - Nq))
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n                                                 # (BN,)
        kt = tl.load(kt_ptrs, mask=(cols[None, :] < Nk) & d_ok[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=(cols[:, None] < Nk) & d_ok[None, :], other=0.0)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale            # (BM, BN), base 2
        visible = cols[None, :] < Nk                                            # (1, BN)
        if CAUSAL:  # bottom-right: row i sees key j <= i + Nk - Nq
            visible = visible & (cols[None, :] <= offs_m[:, None] + Nk - Nq)   # (BM, BN)
        s = tl.where(visible, s, float("-inf"))
        acc, m_i, l_i = tile_update(acc, m_i, l_i, s, v, DOT_PRECISION)
        kt_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn

    empty = l_i == 0.0                                 # rows that saw no key: out 0, lse -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]                              # (BM, BD)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    o_ptrs = (Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
              + offs_m[:, None] * stride_om + offs_d[None, :])
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < Nq) & d_ok[None, :])
    tl.store(Lse + off_bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)


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
