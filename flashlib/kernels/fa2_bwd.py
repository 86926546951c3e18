"""FlashAttention-2 backward in Triton: recompute P from the saved lse, never store it.

Follows Dao, "FlashAttention-2" (2023), section 3.1 and Algorithm 2, as two launches:
1. ``_dq_kernel``: one program per query block, streaming key blocks: dQ += scale * dS K. It
   first computes D_i = rowsum(dO_i * O_i) (equals rowsum(P_i * dP_i)) and stores it for 2;
2. ``_dkdv_kernel``: one program per key/value block (KV outer), streaming query blocks:
   P^T = exp2(K Q^T * scale*log2e - lse*log2e), dV += P^T dO, dP^T = V dO^T,
   dS^T = P^T * (dP^T - D), dK += scale * dS^T Q. With grouped-query heads the program also loops
   over the query heads of its group, so dK/dV are summed without atomics.
Memory stays O(N): only lse (B, H, N) and D are kept besides q, k, v, out.

Causal blocks are skipped and split into masked (diagonal band / ragged tail) and unmasked runs,
as in the forward. Padded rows and columns load as zeros; lse of padded or empty rows is read as
+inf, so their P is exactly 0. Tiles that lie inside the sequence and a head dim that fills
BLOCK_D load without bounds: bounds checks on the streamed Q/dO tiles cost measurable time in
the (block-sparse) dK/dV pass (benchmarks/probes/NOTES.md).
"""

import torch
import triton
import triton.language as tl

from .. import runtime
from .config import cdiv, packed_dims, padded_headdim, prologue, size_bucket, tuned
from .launch import fast_launch, plan_key, remember
from .score_mod import kernel_args as score_mod_args
from .fa2_fwd import lse_rows, sequence
from .tile import LOG2E, key_range


@triton.jit
def row_delta(out_base, delta_base, do, stride_om, offs_m, offs_d, Nq, D):
    """D_i = rowsum(dO_i * O_i) of one query block, (BM,) float32 (it equals rowsum(P_i * dP_i)).

    The dQ pass computes it from the dO block it holds anyway and stores it for the dK/dV pass,
    launched after it: one more load of O, instead of a separate launch reading O and dO again.
    The bases point to this (batch, head)'s row 0 of O and of D (laid out as the lse).
    """
    row_ok = (offs_m[:, None] < Nq) & (offs_d[None, :] < D)
    o = tl.load(out_base + offs_m[:, None] * stride_om + offs_d[None, :], mask=row_ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)                                 # (BM,)
    tl.store(delta_base + offs_m, delta, mask=offs_m < Nq)
    return delta


@triton.jit
def load_lse2(Lse, offs, N, BOUNDED: tl.constexpr = True):
    """lse in base 2; padded (offs >= N) and empty (-inf) rows become +inf so that P = 0.
    BOUNDED: offs may reach past N."""
    if BOUNDED:
        lse = tl.load(Lse + offs, mask=offs < N, other=float("inf"))
    else:
        lse = tl.load(Lse + offs)
    return tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)


@triton.jit
def _load_transposed(base, rows, stride, N, offs_d, D, BOUNDED: tl.constexpr, EVEN_D: tl.constexpr):
    """Rows ``rows`` (BX,) of a (N, D) matrix as a transposed (BD, BX) tile, zeros past D and, when
    BOUNDED (the rows may reach past N), past N. A tile inside both loads without bounds checks."""
    ptrs = base + rows[None, :] * stride + offs_d[:, None]
    if BOUNDED:
        return tl.load(ptrs, mask=(rows[None, :] < N) & (offs_d[:, None] < D), other=0.0)
    if EVEN_D:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=offs_d[:, None] < D, other=0.0)


@triton.jit
def store_rows(base, tile, rows, stride, N, offs_d, D):
    """Store ``tile`` (BX, BD) as rows ``rows`` (BX,) of the (N, D) matrix at ``base`` (batch and
    head applied), in its dtype, nothing past N or D: how dQ, dK and dV are written."""
    tl.store(base + rows[:, None] * stride + offs_d[None, :], tile.to(base.dtype.element_ty),
             mask=(rows[:, None] < N) & (offs_d[None, :] < D))


@triton.jit
def dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, offs_m, Nq,
              qk_scale, offs_d, D, visible, q_pos, k_pos, bh, mod_args, MASKED: tl.constexpr,
              BOUNDED: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
              SCORE_MOD: tl.constexpr):
    """Add one query tile's (rows ``offs_m``) share to dK, dV (BN, BD) of a resident K, V block.

    SCORE_MOD as in the forward, on the transposed tile: q_pos (BM,) and k_pos (BN,) positions on
    the key axis; its derivative scales dS^T.

    MASKED: P^T is zeroed outside ``visible`` (BN, BM). BOUNDED: the tile may reach past Nq; those
    rows load as zeros with lse = +inf, so their P is 0. EVEN_D: D == BD, no column bounds.
    Shared with block-sparse.
    """
    qt = _load_transposed(q_base, offs_m, stride_qm, Nq, offs_d, D, BOUNDED, EVEN_D)      # (BD, BM)
    dot_ = _load_transposed(do_base, offs_m, stride_dom, Nq, offs_d, D, BOUNDED, EVEN_D)  # (BD, BM)
    lse2 = load_lse2(lse_base, offs_m, Nq, BOUNDED)                              # (BM,)
    if BOUNDED:
        delta = tl.load(delta_base + offs_m, mask=offs_m < Nq, other=0.0)         # (BM,)
    else:
        delta = tl.load(delta_base + offs_m)
    st = tl.dot(k, qt, input_precision=DOT_PRECISION) * qk_scale                  # (BN, BM)
    st, dmod = SCORE_MOD(st, q_pos[None, :], k_pos[:, None], bh, mod_args)        # (BN, BM)
    pt = tl.math.exp2(st - lse2[None, :])                                         # (BN, BM)
    if MASKED:
        pt = tl.where(visible, pt, 0.0)
    dv = tl.dot(pt.to(dot_.dtype), tl.trans(dot_), dv, input_precision=DOT_PRECISION)  # (BN, BD)
    dpt = tl.dot(v, dot_, input_precision=DOT_PRECISION)                          # (BN, BM)
    dst = pt * (dpt - delta[None, :]) * dmod                                      # (BN, BM)
    dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=DOT_PRECISION)  # (BN, BD)
    return dk, dv


@triton.jit
def _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                       lo, hi, Nq, causal_offset, qk_scale, offs_n, offs_d, D, bh, mod_args,
                       MASKED: tl.constexpr, BOUNDED: tl.constexpr, EVEN_D: tl.constexpr,
                       BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr, SCORE_MOD: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks [lo, hi); BOUNDED if hi may pass Nq."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)                                  # (BM,)
        q_pos = offs_m + causal_offset                                            # (BM,)
        visible = offs_n[:, None] <= q_pos[None, :]                               # (BN, BM) causal
        dk, dv = dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                           offs_m, Nq, qk_scale, offs_d, D, visible, q_pos, offs_n, bh, mod_args,
                           MASKED, BOUNDED, EVEN_D, DOT_PRECISION, SCORE_MOD)
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, dOut, Lse, Delta, dK, dV, ModArgs, CuSeqQ, CuSeqK,
                 stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                 stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                 stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                 Hq, Hkv, Nq, Nk, D, scale, qk_scale, n_bucket, total_q,
                 GROUP, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, SCORE_MOD: tl.constexpr, VARLEN: tl.constexpr):
    n_n = tl.cdiv(Nk, BLOCK_N)
    off_bkv = tl.program_id(0) // n_n          # flat grid: B x H may exceed CUDA's 65535 on axis 1
    off_b, off_hkv = off_bkv // Hkv, off_bkv % Hkv
    start_n = tl.program_id(0) % n_n * BLOCK_N
    q0, Nq, k0, Nk = sequence(CuSeqQ, CuSeqK, off_b, Nq, Nk, VARLEN)
    if VARLEN:
        if start_n >= Nk:                      # past this sequence's last key block
            return
    offs_n = start_n + tl.arange(0, BLOCK_N)                                          # (BN,)
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = (offs_n[:, None] < Nk) & (offs_d[None, :] < D)
    k = tl.load(K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh + k0 * stride_kn
                + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)  # (BN, BD)
    v = tl.load(V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh + k0 * stride_vn
                + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)  # (BN, BD)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # query rows that see this key block: [lo, Nq); rows >= mid see all of it (no mask needed);
    # query blocks from n_even on reach past Nq (the ragged tail: bounded loads)
    causal_offset = Nk - Nq
    n_even = Nq // BLOCK_M * BLOCK_M
    if CAUSAL:
        lo = tl.minimum(tl.maximum(start_n - causal_offset, 0), Nq) // BLOCK_M * BLOCK_M
        mid = tl.minimum(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, lo), Nq)
        mid = tl.cdiv(mid, BLOCK_M) * BLOCK_M
    else:
        lo = 0
        mid = 0
    for g in range(GROUP):                         # the query heads that share this K/V head
        off_h = off_hkv * GROUP + g
        off_bh = off_b * Hq + off_h
        q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh + q0 * stride_qm
        do_base = dOut + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh + q0 * stride_dom
        lse_base = lse_rows(Lse, off_b, off_h, Hq, Nq, q0, total_q, VARLEN)
        delta_base = lse_rows(Delta, off_b, off_h, Hq, Nq, q0, total_q, VARLEN)
        if lo < mid:   # the diagonal band: none without a causal mask
            dk, dv = _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                        stride_qm, stride_dom, lo, mid, Nq, causal_offset,
                                        qk_scale, offs_n, offs_d, D, off_bh, ModArgs, True, True,
                                        EVEN_D, BLOCK_M, DOT_PRECISION, SCORE_MOD)
        tail = tl.maximum(mid, n_even)
        dk, dv = _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                    stride_qm, stride_dom, mid, tail, Nq, causal_offset,
                                    qk_scale, offs_n, offs_d, D, off_bh, ModArgs, False, False,
                                    EVEN_D, BLOCK_M, DOT_PRECISION, SCORE_MOD)
        if tail < Nq:  # a branch: even an empty loop sets up its software pipeline
            dk, dv = _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                        stride_qm, stride_dom, tail, Nq, Nq, causal_offset,
                                        qk_scale, offs_n, offs_d, D, off_bh, ModArgs, False, True,
                                        EVEN_D, BLOCK_M, DOT_PRECISION, SCORE_MOD)
    dk = dk * scale
    store_rows(dK + off_b.to(tl.int64) * stride_dkb + off_hkv.to(tl.int64) * stride_dkh + k0 * stride_dkn,
               dk, offs_n, stride_dkn, Nk, offs_d, D)
    store_rows(dV + off_b.to(tl.int64) * stride_dvb + off_hkv.to(tl.int64) * stride_dvh + k0 * stride_dvn,
               dv, offs_n, stride_dvn, Nk, offs_d, D)


@triton.jit
def dq_tile(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, cols, Nk, qk_scale,
            offs_d, D, visible, q_pos, bh, mod_args, MASKED: tl.constexpr, BOUNDED: tl.constexpr,
            EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr, SCORE_MOD: tl.constexpr):
    """Add one key tile's (columns ``cols``) share to dQ (BM, BD) of a resident query block.

    SCORE_MOD as in the forward (q_pos (BM,) on the key axis); its derivative scales dS.

    MASKED: P is zeroed outside ``visible`` (BM, BN). BOUNDED: the tile may reach past Nk.
    EVEN_D: D == BD. Shared with block-sparse.
    """
    kt = _load_transposed(k_base, cols, stride_kn, Nk, offs_d, D, BOUNDED, EVEN_D)     # (BD, BN)
    vt = _load_transposed(v_base, cols, stride_vn, Nk, offs_d, D, BOUNDED, EVEN_D)     # (BD, BN)
    s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale                    # (BM, BN)
    s, dmod = SCORE_MOD(s, q_pos[:, None], cols[None, :], bh, mod_args)              # (BM, BN)
    p = tl.math.exp2(s - lse2[:, None])                                             # (BM, BN)
    if MASKED:
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, vt, input_precision=DOT_PRECISION)                              # (BM, BN)
    ds = p * (dp - delta[:, None]) * dmod                                           # (BM, BN)
    return tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT_PRECISION)  # (BM, BD)


@triton.jit
def _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, lo, hi, Nk,
                   causal_offset, qk_scale, offs_m, offs_d, D, bh, mod_args,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, SCORE_MOD: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [lo, hi)."""
    q_pos = offs_m + causal_offset                                                      # (BM,)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + tl.arange(0, BLOCK_N)                                          # (BN,)
        visible = cols[None, :] < Nk                                                    # (1, BN)
        if CAUSAL:
            visible = visible & (cols[None, :] <= q_pos[:, None])                      # (BM, BN)
        # the masked run holds the ragged tail, so only it needs bounds
        dq = dq_tile(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, cols, Nk, qk_scale,
                     offs_d, D, visible, q_pos, bh, mod_args, MASKED, MASKED, EVEN_D, DOT_PRECISION,
                     SCORE_MOD)
    return dq


@triton.jit
def _dq_kernel(Q, K, V, Out, dOut, Lse, Delta, dQ, ModArgs, CuSeqQ, CuSeqK,
               stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
               stride_ob, stride_oh, stride_om, stride_dqb, stride_dqh, stride_dqm,
               Hq, Nq, Nk, D, scale, qk_scale, n_bucket, total_q,
               GROUP, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
               DOT_PRECISION: tl.constexpr, SCORE_MOD: tl.constexpr, VARLEN: tl.constexpr):
    n_m = tl.cdiv(Nq, BLOCK_M)
    pid_m = tl.program_id(0) % n_m
    off_bh = tl.program_id(0) // n_m           # flat grid: B x H may exceed CUDA's 65535 on axis 1
    if CAUSAL:  # heavy query blocks first
        pid_m = n_m - 1 - pid_m
    off_b, off_h = off_bh // Hq, off_bh % Hq
    off_hkv = off_h // GROUP
    start_m = pid_m * BLOCK_M
    q0, Nq, k0, Nk = sequence(CuSeqQ, CuSeqK, off_b, Nq, Nk, VARLEN)
    if VARLEN:
        if start_m >= Nq:                       # past this sequence's last query block
            return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = (offs_m[:, None] < Nq) & (offs_d[None, :] < D)
    q = tl.load(Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh + q0 * stride_qm
                + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok, other=0.0)      # (BM, BD)
    do = tl.load(dOut + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh + q0 * stride_dom
                 + offs_m[:, None] * stride_dom + offs_d[None, :], mask=row_ok, other=0.0)   # (BM, BD)
    lse2 = load_lse2(lse_rows(Lse, off_b, off_h, Hq, Nq, q0, total_q, VARLEN), offs_m, Nq)
    delta = row_delta(Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh + q0 * stride_om,
                      lse_rows(Delta, off_b, off_h, Hq, Nq, q0, total_q, VARLEN), do, stride_om,
                      offs_m, offs_d, Nq, D)                                                  # (BM,)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh + k0 * stride_kn
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh + k0 * stride_vn
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # key range: [0, n_full) needs no mask; [n_full, hi) is the diagonal band and/or ragged tail
    causal_offset = Nk - Nq
    n_full, hi = key_range(start_m, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, 0, n_full,
                        Nk, causal_offset, qk_scale, offs_m, offs_d, D, off_bh, ModArgs,
                        False, CAUSAL, EVEN_D, BLOCK_N, DOT_PRECISION, SCORE_MOD)
    if n_full < hi:   # a branch: even an empty loop sets up its software pipeline
        dq = _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, n_full,
                            hi, Nk, causal_offset, qk_scale, offs_m, offs_d, D, off_bh, ModArgs,
                            True, CAUSAL, EVEN_D, BLOCK_N, DOT_PRECISION, SCORE_MOD)
    dq = dq * scale
    store_rows(dQ + off_b.to(tl.int64) * stride_dqb + off_h.to(tl.int64) * stride_dqh + q0 * stride_dqm,
               dq, offs_m, stride_dqm, Nq, offs_d, D)


# (BLOCK_M, BLOCK_N, num_warps, num_stages); the first is used when autotuning is off
DKDV_CONFIGS = [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3), (32, 64, 4, 2),
                (64, 128, 4, 2), (32, 64, 4, 1), (16, 32, 4, 1)]
DQ_CONFIGS = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2),
              (128, 64, 4, 2), (64, 32, 4, 1), (32, 16, 4, 1), (128, 64, 4, 3)]
# SRAM: dK/dV keep a K and a V block and stream Q and dO blocks; dQ keeps Q, dO and streams K, V.
# Untuned, per head dim: the best fixed config of a probe (benchmarks/probes/backward_config_probe.py;
# the lists' first configs were slower and spilled at d128: NOTES.md). Block-sparse keeps the lists' own.
_choose_dkdv = tuned(_dkdv_kernel, DKDV_CONFIGS, lambda bm, bn: (2 * bn, 2 * bm),
                     prefer=lambda block_d: (64, 64, 4, 3) if block_d <= 64 else (64, 128, 8, 3))
_choose_dq = tuned(_dq_kernel, DQ_CONFIGS, lambda bm, bn: (2 * bm, 2 * bn), prefer=lambda block_d: (128, 64, 8, 3))


def fa2_backward(q, k, v, out, lse, dout, *, causal=False, scale=None, allow_tf32=False,
                 score_mod=None, cu_seqlens=None, max_seqlen=None, options=None):
    """Gradients of attention from the saved (q, k, v, out, lse). Returns ``(dq, dk, dv)``.

    Shapes as ``fa2_forward``: q, out, dout (B, Hq, Nq, D); k, v (B, Hkv, Nk, D);
    lse (B, Hq, Nq) float32 natural log. dk, dv are summed over each group of query heads.
    score_mod: the forward's ``kernels.score_mod.ScoreMod`` (None: none). cu_seqlens, max_seqlen:
    packed sequences, as ``fa2_forward``. options: a ``runtime.KernelOptions`` (None: those in force).
    """
    options = runtime.OPTIONS if options is None else options
    runtime.check_kernel(_dkdv_kernel)
    mod_args, mod_fn, input_scale = score_mod_args(score_mod, None)
    pointers = (q, k, v, out, dout, lse, *(cu_seqlens or ()), *([] if mod_args is None else [mod_args]))
    plannable = dout.dtype == q.dtype and lse.is_contiguous()
    extra = (causal, scale, allow_tf32, mod_fn, input_scale, max_seqlen)
    key = plan_key(pointers, extra, options) if plannable else None
    plan = _plans.get(key)
    if plan is not None:   # a call like an earlier one: allocate and replay its two launches
        dq_launch, dkdv_launch = plan
        dq, dk, dv, delta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)
        mod_args = lse if mod_args is None else mod_args
        offsets = cu_seqlens or (lse, lse)
        dq_launch(q, k, v, out, dout, lse, delta, dq, mod_args, *offsets)
        dkdv_launch(q, k, v, dout, lse, delta, dk, dv, mod_args, *offsets)
        return dq, dk, dv
    (q, k, v, out, dout), scale, precision, grad_dtype = prologue(
        q, k, v, out, dout.to(q.dtype), scale=scale, allow_tf32=allow_tf32)
    dims = packed_dims(q, k, cu_seqlens, max_seqlen)
    B, Hq, Hkv, Nq, Nk, D = dims.sizes
    lse = lse.contiguous()
    block_d = padded_headdim(D)
    n_bucket = size_bucket(Nq, Nk, slices=B * Hq)

    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    delta = torch.empty_like(lse)                                    # written by the dQ pass
    common = (*dims.strides(q), *dims.strides(k), *dims.strides(v), *dims.strides(dout))
    scores = B * Hq * Nq * Nk
    dq_kernel, dq_config = _choose_dq(block_d, q.element_size(), scores, autotune=runtime.autotuning(options))
    dkdv_kernel, dkdv_config = _choose_dkdv(block_d, q.element_size(), scores, autotune=runtime.autotuning(options))
    mod_args = lse if mod_args is None else mod_args
    dq_launch = fast_launch(
        dq_kernel, lambda meta: (cdiv(Nq, meta["BLOCK_M"]) * B * Hq,),
        q, k, v, out, dout, lse, delta, dq, mod_args, *dims.offsets(lse), *common,
        *dims.strides(out), *dims.strides(dq), Hq, Nq, Nk, D, scale, scale * LOG2E * input_scale, n_bucket,
        dims.total_q, GROUP=Hq // Hkv, CAUSAL=bool(causal), BLOCK_D=block_d, EVEN_D=D == block_d,
        DOT_PRECISION=precision, SCORE_MOD=mod_fn, VARLEN=dims.cu_q is not None,
        **dq_config, kernel_options=options)
    dkdv_launch = fast_launch(
        dkdv_kernel, lambda meta: (cdiv(Nk, meta["BLOCK_N"]) * B * Hkv,),
        q, k, v, dout, lse, delta, dk, dv, mod_args, *dims.offsets(lse), *common,
        *dims.strides(dk), *dims.strides(dv), Hq, Hkv, Nq, Nk, D, scale, scale * LOG2E * input_scale, n_bucket,
        dims.total_q, GROUP=Hq // Hkv, CAUSAL=bool(causal), BLOCK_D=block_d, EVEN_D=D == block_d,
        DOT_PRECISION=precision, SCORE_MOD=mod_fn, VARLEN=dims.cu_q is not None,
        **dkdv_config, kernel_options=options)
    remember(_plans, key, (dq_launch, dkdv_launch))
    return dq.to(grad_dtype), dk.to(grad_dtype), dv.to(grad_dtype)


_plans = {}   # launch.plan_key -> (dQ Launch, dK/dV Launch)
