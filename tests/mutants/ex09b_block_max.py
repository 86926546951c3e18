"""Mutant of ex09b: the max is the current block's, not the running max (m_new = rowmax(s))."""
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime

EXPECTED_HINT = 'running max'

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)    # ln(2): ln(x) = log2(x) * LN2


@triton.jit
def block_sparse_kernel(Q, K, V, Out, Lse, KvCount, KvFull, KvIndex, KvBitmap, Bitmaps,
                        stride_qb, stride_qh, stride_qm,
                        stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn,
                        stride_ob, stride_oh, stride_om,
                        Hq, Nq, Nk, D, n_kblocks, qk_scale, GROUP,
                        BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Block-sparse forward for query block ``tl.program_id(0)`` of (batch, head) ``tl.program_id(1)``.

    Q (B, Hq, Nq, D), K and V (B, Hq // GROUP, Nk, D), Out like Q: pointers to element
    [0, 0, 0, 0]; stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches,
    heads and rows of tensor x (its last dim is contiguous). Lse: contiguous (B, Hq, Nq) float32.
    KvCount, KvFull, KvIndex, KvBitmap, Bitmaps: the mask's tables (module docstring);
    n_kblocks = cdiv(Nk, BLOCK). qk_scale: softmax scale * log2(e). BLOCK: the mask's block size
    (a power of two >= 16); BLOCK_D: a power of two >= D. Writes Out[b, h, rows] and
    Lse[b, h, rows] for this block's rows < Nq (out 0 and lse -inf on rows with no visible key);
    reads only the key blocks of its list, and writes nothing else.
    """
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // Hq
    off_h = off_bh % Hq
    off_hkv = off_h // GROUP                                   # grouped-query: GROUP heads share K/V
    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)               # (BM,) this block's query rows
    offs_r = tl.arange(0, BLOCK)                               # (BN,) positions inside a block
    offs_d = tl.arange(0, BLOCK_D)                             # (BD,)
    d_ok = offs_d < D
    q = tl.load(Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
                + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < Nq) & d_ok[None, :], other=0.0)          # (BM, BD)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh

    row = off_bh.to(tl.int64) * tl.cdiv(Nq, BLOCK) + pid_m    # this program's row of the tables
    n_full = tl.load(KvFull + row)
    n_all = tl.load(KvCount + row)
    acc = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(0, n_all):                                  # full blocks first, then partial
        cols = tl.load(KvIndex + row * n_kblocks + t) * BLOCK + offs_r          # (BN,) keys
        kv_ok = (cols[:, None] < Nk) & d_ok[None, :]           # a partial block may pass Nk
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale   # (BM, BN) base 2
        if t >= n_full:                                        # partial: its bitmap masks it
            tile = tl.load(KvBitmap + row * n_kblocks + t).to(tl.int64)
            bits = tl.load(Bitmaps + tile * (BLOCK * BLOCK) + offs_r[:, None] * BLOCK
                           + offs_r[None, :])                  # (BM, BN) uint8
            s = tl.where(bits != 0, s, float("-inf"))
        m_new = tl.max(s, 1)                  # (BM,)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: no NaN
        alpha = tl.math.exp2(m_i - m_safe)                     # (BM,) rescale of the old state
        p = tl.math.exp2(s - m_safe[:, None])                  # (BM, BN)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    empty = l_i == 0.0                                         # no visible key: out 0, lse -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]                              # (BM, BD)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    tl.store(Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
             + offs_m[:, None] * stride_om + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < Nq) & d_ok[None, :])
    tl.store(Lse + off_bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)


def block_sparse_forward(q, k, v, mask, *, scale=None, num_warps=4, num_stages=2,
                         kernel=block_sparse_kernel):
    """Launch ``kernel`` (yours by default): returns ``(out, lse)`` like
    ``flashlib.block_sparse_attention(q, k, v, mask, return_lse=True)``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 and D <= 256, last dim contiguous.
    mask: a ``flashlib.masks.BlockMask`` for (Nq, Nk) whose (Bm, Hm) broadcast over (B, Hq)
    (e.g. ``flashlib.masks.sliding_window(Nq, Nk, 256, block_size=64)``); the kernel's tile is its
    block_size. out: like q; lse: (B, Hq, Nq) float32, natural log.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Nk, D) or v.shape != k.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, Hq, Nq, D) and (B, Hkv, Nk, D) with Hq % Hkv == 0")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("q, k and v need a contiguous last dim (stride 1)")
    if (mask.seqlen_q, mask.seqlen_k) != (Nq, Nk):
        raise ValueError(f"the mask is for seqlen_q={mask.seqlen_q}, seqlen_k={mask.seqlen_k}; "
                         f"q and k have Nq={Nq}, Nk={Nk}")
    Bm, Hm, n_qblocks, n_kblocks = mask.shape
    if Bm not in (1, B) or Hm not in (1, Hq):
        raise ValueError(f"the mask's (batch, heads) ({Bm}, {Hm}) do not broadcast over ({B}, {Hq})")
    if B * Hq > 65535:  # CUDA caps grid axes 1 and 2
        raise ValueError(f"batch x heads_q = {B * Hq} exceeds 65535, the grid's axis-1 limit")
    mask = mask.to(q.device)
    tables = [t.expand(B, Hq, *t.shape[2:]).contiguous()                        # (B, Hq, nQ[, nK])
              for t in (mask.kv_count, mask.kv_full, mask.kv_index, mask.kv_bitmap)]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    kernel[(n_qblocks, B * Hq)](
        q, k, v, out, lse, *tables, mask.bitmaps.contiguous(), *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *out.stride()[:3], Hq, Nq, Nk, D, n_kblocks, scale * math.log2(math.e), Hq // Hkv,
        BLOCK=mask.block_size, BLOCK_D=max(16, triton.next_power_of_2(D)), DOT_PRECISION="ieee",
        num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return out, lse
