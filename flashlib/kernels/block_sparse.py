"""Block-sparse FlashAttention in Triton: the FA2 kernels, visiting only a mask's non-empty blocks.

Follows Dao et al., "FlashAttention" (2022), section 3.3 (block-sparse FlashAttention, Algorithm 5)
with FlashAttention-2's loop order and backward (Dao 2023, Algorithms 1 and 2). The mask comes from
``flashlib.masks.BlockMask``, stored the way these kernels read it:

- forward and dQ: one program per query tile walks the key blocks listed for its query block,
  full blocks first (no mask, no bounds check: a block reaching past Nk is never full), then
  partial ones (the element mask computed from the mask's band for causal and sliding-window
  masks, else read from the block's bitmap); empty blocks are never loaded;
- dK/dV: one program per key tile walks the transposed lists (the query blocks that see its key
  block), summing over the query heads of a grouped-query group as the dense kernel does; a
  ragged last query block can be full, so its query tiles load with bounds unless Nq fills it.
Where every list's full blocks are adjacent (bands, documents, all-full masks: the mask's
``kv_full_adjacent`` / ``q_full_adjacent``), the kernels step through them as the dense loop
does, without reading the list.

The per-tile work is the dense kernels' own (``fa2_fwd.attend_tile``, ``fa2_bwd.dq_tile``,
``fa2_bwd.dkdv_tile``); only the loops differ. A kernel tile (BLOCK_M x BLOCK_N) is a power of two
no larger than the mask's block, so one mask block is visited as one or more tiles. Causal masking
is part of the mask (diagonal blocks are partial), so the kernels need no causal flag. Limits: the
mask is built on the host side of the call (``flashlib.masks``), and its bitmaps cost one byte per
element of each partial block.
"""

import torch
import triton
import triton.language as tl

from .. import runtime
from .config import cdiv, padded_headdim, prologue, size_bucket, tuned
from .fa2_bwd import (DKDV_CONFIGS, DQ_CONFIGS, dkdv_tile, dq_tile, load_lse2, row_delta,
                      store_rows)
from .fa2_fwd import CONFIGS, attend_tile, load_rows, write_output
from .launch import fast_launch
from .score_mod import kernel_args as score_mod_args
from .tile import LOG2E, tile_update

KEY = ["n_bucket", "visits", "BAND", "ADJACENT", "BLOCK_D", "SPARSE_BLOCK", "DOT_PRECISION",
       "SCORE_MOD"]


@triton.jit
def _visit_list(Count, Full, Index, Bitmap, off_b, off_h, block, slice_b, slice_h, n_rows, n_cols):
    """Where one row of a mask's visit lists starts, and how many entries are full / in all.

    The tables are (Bm, Hm, n_rows[, n_cols]); slice_b, slice_h are 0 where the mask broadcasts.
    """
    row = (off_b * slice_b + off_h * slice_h) * n_rows + block
    n_full = tl.load(Full + row)
    n_all = tl.load(Count + row)
    return Index + row.to(tl.int64) * n_cols, Bitmap + row.to(tl.int64) * n_cols, n_full, n_all


@triton.jit
def _first_start(index, SPARSE_BLOCK: tl.constexpr):
    """Start (row or column) of a visit list's first tile. Every entry of a list's row is a valid
    block (the empty ones follow the listed ones), so the load needs no mask and so does not wait
    for the counts: a program's first K/V load is one memory round trip later, not two."""
    return tl.load(index) * SPARSE_BLOCK


@triton.jit
def _next_start(index, t, n_tiles, start, TILES: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
                BLOCK: tl.constexpr, ADJACENT: tl.constexpr):
    """Start of tile t + 1, from tile t's ``start``: the next tile of the same mask block, or the
    first tile of the next listed block. Carrying the start from one iteration to the next (rather
    than loading it where it is used) lets Triton's pipeliner prefetch K/V as in the dense loop.
    ADJACENT: the listed blocks are adjacent, so the next start needs no list load (one load
    fewer per tile on the loop's critical path; measured in benchmarks/probes/NOTES.md)."""
    if ADJACENT:
        return tl.multiple_of(start + BLOCK, BLOCK)
    listed = tl.load(index + (t + 1) // TILES, mask=t + 1 < n_tiles, other=0)
    return tl.multiple_of(tl.where((t + 1) % TILES == 0, listed * SPARSE_BLOCK, start + BLOCK), BLOCK)


@triton.jit
def _partial_mask(Bitmaps, bitmap_entry, rows, cols, Nq, Nk, band_lo, band_hi, BAND: tl.constexpr,
                  EVEN_N: tl.constexpr, SPARSE_BLOCK: tl.constexpr):
    """The element mask of a partial block at query ``rows`` x key ``cols`` (absolute indices, any
    shapes that broadcast). BAND: computed from the mask's band, key j allowed for query i iff
    band_lo <= j - (i + Nk - Nq) <= band_hi (causal and sliding windows), no memory read;
    otherwise loaded from the block's bitmap, whose id ``bitmap_entry`` points to.
    EVEN_N: Nk is a multiple of the mask's block, so no listed key lies past Nk."""
    if BAND:
        # the two-sided test as one subtraction and one unsigned compare per element:
        # lo <= x <= hi  iff  (x - lo), read as unsigned, <= hi - lo. A narrow window's partial
        # tiles are a large share of its work (2 of 9 blocks at W = 1024), so this test is hot.
        shifted = (cols - (rows + (Nk - Nq) + band_lo)).to(tl.uint32, bitcast=True)
        visible = shifted <= (band_hi - band_lo).to(tl.uint32, bitcast=True)
        if EVEN_N:
            return visible
        return visible & (cols < Nk)
    base = Bitmaps + tl.load(bitmap_entry).to(tl.int64) * (SPARSE_BLOCK * SPARSE_BLOCK)
    return tl.load(base + (rows % SPARSE_BLOCK) * SPARSE_BLOCK + cols % SPARSE_BLOCK) != 0


@triton.jit
def _bs_fwd_kernel(Q, K, V, Out, Lse, ModArgs, KvCount, KvFull, KvIndex, KvBitmap, Bitmaps,
                   stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                   stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                   slice_b, slice_h, Hq, Nq, Nk, D, n_qblocks, n_kblocks, qk_scale, n_bucket, visits, GROUP,
                   band_lo, band_hi, BAND: tl.constexpr, ADJACENT: tl.constexpr, EVEN_N: tl.constexpr,
                   SPARSE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, EVEN_M: tl.constexpr, EVEN_D: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, SCORE_MOD: tl.constexpr):
    n_m = tl.cdiv(Nq, BLOCK_M)
    pid_m = tl.program_id(0) % n_m
    off_bh = tl.program_id(0) // n_m
    off_b, off_h = off_bh // Hq, off_bh % Hq
    off_hkv = off_h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)                                # (BM,)
    offs_n = tl.arange(0, BLOCK_N)                                          # (BN,)
    offs_d = tl.arange(0, BLOCK_D)                                          # (BD,)
    q_pos = offs_m + (Nk - Nq)                                              # (BM,) on the key axis
    q = load_rows(Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh,
                  offs_m, offs_d, stride_qm, Nq, D, EVEN_M and EVEN_D)      # (BM, BD)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    index, bitmap, n_full, n_all = _visit_list(KvCount, KvFull, KvIndex, KvBitmap, off_b, off_h,
                                               start_m // SPARSE_BLOCK, slice_b, slice_h, n_qblocks, n_kblocks)
    TILES: tl.constexpr = SPARSE_BLOCK // BLOCK_N          # kernel tiles per mask block
    start_n = _first_start(index, SPARSE_BLOCK)
    for t in range(0, n_full * TILES):                     # full blocks: no mask, no bounds
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn,
                                    start_n + offs_n, Nk, qk_scale, offs_d, D, 0, q_pos, off_bh,
                                    ModArgs, 0, 0, 0, False, False, EVEN_D, DOT_PRECISION,
                                    tile_update, SCORE_MOD)
        start_n = _next_start(index, t, n_full * TILES, start_n, TILES, SPARSE_BLOCK, BLOCK_N, ADJACENT)
    if n_full < n_all:   # a branch: even an empty loop sets up its pipeline (kernels/decode.py)
        start_n = _first_start(index + n_full, SPARSE_BLOCK)
        for t in range(0, (n_all - n_full) * TILES):       # partial blocks: element mask
            visible = _partial_mask(Bitmaps, bitmap + n_full + t // TILES, offs_m[:, None],
                                    (start_n + offs_n)[None, :], Nq, Nk, band_lo, band_hi, BAND,
                                    EVEN_N, SPARSE_BLOCK)                   # (BM, BN)
            acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn,
                                        start_n + offs_n, Nk, qk_scale, offs_d, D, visible, q_pos,
                                        off_bh, ModArgs, 0, 0, 0, True, not EVEN_N, EVEN_D,
                                        DOT_PRECISION, tile_update, SCORE_MOD)
            start_n = _next_start(index + n_full, t, (n_all - n_full) * TILES, start_n, TILES,
                                  SPARSE_BLOCK, BLOCK_N, False)
    write_output(Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh,
                 Lse + off_bh.to(tl.int64) * Nq, acc, m_i, l_i, stride_om, offs_m, offs_d, Nq, D,
                 EVEN_M, EVEN_D)


@triton.jit
def _bs_dq_kernel(Q, K, V, Out, dOut, Lse, Delta, dQ, ModArgs, KvCount, KvFull, KvIndex, KvBitmap, Bitmaps,
                  stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                  stride_ob, stride_oh, stride_om, stride_dqb, stride_dqh, stride_dqm, slice_b, slice_h,
                  Hq, Nq, Nk, D, n_qblocks, n_kblocks, scale, qk_scale, n_bucket, visits, GROUP,
                  band_lo, band_hi, BAND: tl.constexpr, ADJACENT: tl.constexpr, EVEN_N: tl.constexpr,
                  SPARSE_BLOCK: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  SCORE_MOD: tl.constexpr):
    n_m = tl.cdiv(Nq, BLOCK_M)
    pid_m = tl.program_id(0) % n_m
    off_bh = tl.program_id(0) // n_m
    off_b, off_h = off_bh // Hq, off_bh % Hq
    off_hkv = off_h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_pos = offs_m + (Nk - Nq)                                                              # (BM,)
    q = load_rows(Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh,
                  offs_m, offs_d, stride_qm, Nq, D, False)                                  # (BM, BD)
    do = load_rows(dOut + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh,
                   offs_m, offs_d, stride_dom, Nq, D, False)                                # (BM, BD)
    lse2 = load_lse2(Lse + off_bh.to(tl.int64) * Nq, offs_m, Nq)
    delta = row_delta(Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh,
                      Delta + off_bh.to(tl.int64) * Nq, do, stride_om, offs_m, offs_d, Nq, D)  # (BM,)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    index, bitmap, n_full, n_all = _visit_list(KvCount, KvFull, KvIndex, KvBitmap, off_b, off_h,
                                               start_m // SPARSE_BLOCK, slice_b, slice_h, n_qblocks, n_kblocks)
    TILES: tl.constexpr = SPARSE_BLOCK // BLOCK_N
    start_n = _first_start(index, SPARSE_BLOCK)
    for t in range(0, n_full * TILES):
        dq = dq_tile(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, start_n + offs_n, Nk,
                     qk_scale, offs_d, D, 0, q_pos, off_bh, ModArgs, False, False, EVEN_D,
                     DOT_PRECISION, SCORE_MOD)
        start_n = _next_start(index, t, n_full * TILES, start_n, TILES, SPARSE_BLOCK, BLOCK_N, ADJACENT)
    if n_full < n_all:
        start_n = _first_start(index + n_full, SPARSE_BLOCK)
        for t in range(0, (n_all - n_full) * TILES):
            visible = _partial_mask(Bitmaps, bitmap + n_full + t // TILES, offs_m[:, None],
                                    (start_n + offs_n)[None, :], Nq, Nk, band_lo, band_hi, BAND,
                                    EVEN_N, SPARSE_BLOCK)                                   # (BM, BN)
            dq = dq_tile(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, start_n + offs_n,
                         Nk, qk_scale, offs_d, D, visible, q_pos, off_bh, ModArgs, True, not EVEN_N,
                         EVEN_D, DOT_PRECISION, SCORE_MOD)
            start_n = _next_start(index + n_full, t, (n_all - n_full) * TILES, start_n, TILES,
                                  SPARSE_BLOCK, BLOCK_N, False)
    store_rows(dQ + off_b.to(tl.int64) * stride_dqb + off_h.to(tl.int64) * stride_dqh, dq * scale,
               offs_m, stride_dqm, Nq, offs_d, D)


@triton.jit
def _bs_dkdv_kernel(Q, K, V, dOut, Lse, Delta, dK, dV, ModArgs, QCount, QFull, QIndex, QBitmap, Bitmaps,
                    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                    slice_b, slice_h, Hq, Hkv, Nq, Nk, D, n_kblocks, n_qblocks, scale, qk_scale, n_bucket, visits,
                    GROUP, band_lo, band_hi, BAND: tl.constexpr, ADJACENT: tl.constexpr,
                    EVEN_N: tl.constexpr, EVEN_M: tl.constexpr,
                    SPARSE_BLOCK: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr, SCORE_MOD: tl.constexpr):
    n_n = tl.cdiv(Nk, BLOCK_N)
    off_bkv = tl.program_id(0) // n_n
    off_b, off_hkv = off_bkv // Hkv, off_bkv % Hkv
    start_n = tl.program_id(0) % n_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)                                                # (BN,)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_rows(K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh,
                  offs_n, offs_d, stride_kn, Nk, D, False)                                  # (BN, BD)
    v = load_rows(V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh,
                  offs_n, offs_d, stride_vn, Nk, D, False)                                  # (BN, BD)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    TILES: tl.constexpr = SPARSE_BLOCK // BLOCK_M
    for g in range(GROUP):                         # the query heads that share this K/V head
        off_h = off_hkv * GROUP + g
        off_bh = off_b * Hq + off_h
        q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        do_base = dOut + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
        lse_base = Lse + off_bh.to(tl.int64) * Nq
        delta_base = Delta + off_bh.to(tl.int64) * Nq
        index, bitmap, n_full, n_all = _visit_list(QCount, QFull, QIndex, QBitmap, off_b, off_h,
                                                   start_n // SPARSE_BLOCK, slice_b, slice_h, n_kblocks, n_qblocks)
        start_m = _first_start(index, SPARSE_BLOCK)
        for t in range(0, n_full * TILES):
            offs_m = start_m + tl.arange(0, BLOCK_M)                                        # (BM,)
            dk, dv = dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                               offs_m, Nq, qk_scale, offs_d, D, 0, offs_m + (Nk - Nq), offs_n, off_bh,
                               ModArgs, False, not EVEN_M, EVEN_D, DOT_PRECISION, SCORE_MOD)
            start_m = _next_start(index, t, n_full * TILES, start_m, TILES, SPARSE_BLOCK, BLOCK_M, ADJACENT)
        if n_full < n_all:
            start_m = _first_start(index + n_full, SPARSE_BLOCK)
            for t in range(0, (n_all - n_full) * TILES):
                # keys are this tile's rows: the mask transposed, (BN, BM)
                offs_m = start_m + tl.arange(0, BLOCK_M)                                    # (BM,)
                visible = _partial_mask(Bitmaps, bitmap + n_full + t // TILES, offs_m[None, :],
                                        offs_n[:, None], Nq, Nk, band_lo, band_hi, BAND, EVEN_N,
                                        SPARSE_BLOCK)
                dk, dv = dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm,
                                   stride_dom, offs_m, Nq, qk_scale, offs_d, D, visible,
                                   offs_m + (Nk - Nq), offs_n, off_bh, ModArgs, True, not EVEN_M,
                                   EVEN_D, DOT_PRECISION, SCORE_MOD)
                start_m = _next_start(index + n_full, t, (n_all - n_full) * TILES, start_m, TILES,
                                      SPARSE_BLOCK, BLOCK_M, False)
    store_rows(dK + off_b.to(tl.int64) * stride_dkb + off_hkv.to(tl.int64) * stride_dkh, dk * scale,
               offs_n, stride_dkn, Nk, offs_d, D)
    store_rows(dV + off_b.to(tl.int64) * stride_dvb + off_hkv.to(tl.int64) * stride_dvh, dv, offs_n,
               stride_dvn, Nk, offs_d, D)


_choose_fwd = tuned(_bs_fwd_kernel, CONFIGS, lambda bm, bn: (bm, 2 * bn), key=KEY)
_choose_dkdv = tuned(_bs_dkdv_kernel, DKDV_CONFIGS, lambda bm, bn: (2 * bn, 2 * bm), key=KEY)
_choose_dq = tuned(_bs_dq_kernel, DQ_CONFIGS, lambda bm, bn: (2 * bm, 2 * bn), key=KEY)


def _slices(mask):
    """(slice_b, slice_h): how far apart (in (batch, head) slices) the mask's tables are; 0 broadcasts."""
    Bm, Hm = mask.batch_heads
    return (0 if Bm == 1 else Hm), (0 if Hm == 1 else 1)


def _band(mask):
    """(band_lo, band_hi, BAND): partial blocks of a band mask (causal, sliding window) are masked
    by arithmetic, others by their bitmaps."""
    return (*mask.band, True) if mask.band is not None else (0, 0, False)


def block_sparse_forward(q, k, v, mask, *, scale=None, allow_tf32=False, score_mod=None, options=None):
    """Launch the block-sparse forward. Returns ``(out, lse)`` like ``fa2_forward``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D); mask: a ``flashlib.masks.BlockMask`` for (Nq, Nk) on
    q's device whose (Bm, Hm) broadcast over (B, Hq); score_mod: a ``kernels.score_mod.ScoreMod``
    or None; options: a ``runtime.KernelOptions`` (None: those in force). Inputs are validated by
    ``flashlib.ops``.
    """
    options = runtime.OPTIONS if options is None else options
    runtime.check_kernel(_bs_fwd_kernel)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    (q, k, v), scale, precision, out_dtype = prologue(q, k, v, scale=scale, allow_tf32=allow_tf32)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    block_d = padded_headdim(D)
    bs = mask.block_size
    kernel, config = _choose_fwd(block_d, q.element_size(), B * Hq * Nq * Nk, bs, autotune=runtime.autotuning(options))
    slice_b, slice_h = _slices(mask)
    mod_args, mod_fn, input_scale = score_mod_args(score_mod, lse)
    fast_launch(
        kernel, lambda meta: (cdiv(Nq, meta["BLOCK_M"]) * B * Hq,),
        q, k, v, out, lse, mod_args, mask.kv_count, mask.kv_full, mask.kv_index, mask.kv_bitmap, mask.bitmaps,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        slice_b, slice_h, Hq, Nq, Nk, D, mask.shape[2], mask.shape[3], scale * LOG2E * input_scale,
        size_bucket(Nq, Nk, slices=B * Hq),
        mask.kv_visits, Hq // Hkv, *_band(mask), ADJACENT=mask.kv_full_adjacent, EVEN_N=Nk % bs == 0,
        SPARSE_BLOCK=bs, BLOCK_D=block_d,
        EVEN_M=Nq % bs == 0, EVEN_D=D == block_d,
        DOT_PRECISION=precision, SCORE_MOD=mod_fn, **config, kernel_options=options)
    return out.to(out_dtype), lse


def block_sparse_backward(q, k, v, out, lse, dout, mask, *, scale=None, allow_tf32=False,
                          score_mod=None, options=None):
    """Gradients of block-sparse attention from the saved (q, k, v, out, lse): ``(dq, dk, dv)``;
    score_mod, options: the forward's."""
    options = runtime.OPTIONS if options is None else options
    runtime.check_kernel(_bs_dkdv_kernel)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    (q, k, v, out, dout), scale, precision, grad_dtype = prologue(
        q, k, v, out, dout.to(q.dtype), scale=scale, allow_tf32=allow_tf32)
    lse = lse.contiguous()
    block_d = padded_headdim(D)
    bs = mask.block_size
    n_bucket = size_bucket(Nq, Nk, slices=B * Hq)
    slice_b, slice_h = _slices(mask)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)   # written by the dQ pass
    common = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
              v.stride(0), v.stride(1), v.stride(2), dout.stride(0), dout.stride(1), dout.stride(2))
    scores = B * Hq * Nq * Nk
    mod_args, mod_fn, input_scale = score_mod_args(score_mod, lse)
    dq_kernel, dq_config = _choose_dq(block_d, q.element_size(), scores, bs, autotune=runtime.autotuning(options))
    dkdv_kernel, dkdv_config = _choose_dkdv(block_d, q.element_size(), scores, bs, autotune=runtime.autotuning(options))
    fast_launch(
        dq_kernel, lambda meta: (cdiv(Nq, meta["BLOCK_M"]) * B * Hq,),
        q, k, v, out, dout, lse, delta, dq, mod_args, mask.kv_count, mask.kv_full, mask.kv_index,
        mask.kv_bitmap, mask.bitmaps, *common, out.stride(0), out.stride(1), out.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2), slice_b, slice_h, Hq, Nq, Nk, D, mask.shape[2],
        mask.shape[3], scale, scale * LOG2E * input_scale,
        n_bucket, mask.kv_visits, Hq // Hkv, *_band(mask), ADJACENT=mask.kv_full_adjacent,
        EVEN_N=Nk % bs == 0, SPARSE_BLOCK=bs,
        BLOCK_D=block_d, EVEN_D=D == block_d, DOT_PRECISION=precision, SCORE_MOD=mod_fn,
        **dq_config, kernel_options=options)
    fast_launch(
        dkdv_kernel, lambda meta: (cdiv(Nk, meta["BLOCK_N"]) * B * Hkv,),
        q, k, v, dout, lse, delta, dk, dv, mod_args, mask.q_count, mask.q_full, mask.q_index, mask.q_bitmap,
        mask.bitmaps, *common, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1),
        dv.stride(2), slice_b, slice_h, Hq, Hkv, Nq, Nk, D, mask.shape[3], mask.shape[2], scale,
        scale * LOG2E * input_scale,
        n_bucket, mask.q_visits, Hq // Hkv, *_band(mask), ADJACENT=mask.q_full_adjacent,
        EVEN_N=Nk % bs == 0, EVEN_M=Nq % bs == 0, SPARSE_BLOCK=bs,
        BLOCK_D=block_d, EVEN_D=D == block_d, DOT_PRECISION=precision, SCORE_MOD=mod_fn,
        **dkdv_config, kernel_options=options)
    return dq.to(grad_dtype), dk.to(grad_dtype), dv.to(grad_dtype)
