"""FlashAttention-2 forward in Triton: the kernel behind ``flashlib.flash_attention``.

Follows Dao, "FlashAttention-2" (2023), section 3.1 and Algorithm 1:
- the grid runs over query blocks x (batch, head): each program owns BLOCK_M query rows, keeps
  their running max, sum and output in registers, and streams K/V blocks through SRAM;
- normalisation is deferred to the end, and the lse (natural log) is written for the backward;
- scores use exp2 with ``scale * log2(e)`` folded into one multiply;
- causal (bottom-right: query i sees key j <= i + Nk - Nq): key blocks entirely above the diagonal
  are never loaded, blocks entirely below it run without a mask, only the diagonal band is masked.
  The same split handles the ragged tail of the keys, so a full block never pays for masking.

The scores pass through the score-modifier hook (``kernels.score_mod``: softcap, ALiBi) before
the mask. VARLEN (``flash_attention_varlen``): the sequences are packed along one axis and each
program reads its sequence's first row and length from ``cu_seqlens`` (``sequence``); the grid
covers the longest sequence and the programs past a shorter one's end return at once.

Layout (batch, heads, seqlen, headdim) with any strides; grouped-query heads (Hq % Hkv == 0);
head dims up to 256, padded inside to a power of two (>= 16) and masked; float16, bfloat16 and
float32 (exact ``ieee`` dots unless ``allow_tf32``). On a GPU it autotunes over a few block
configs; through the interpreter it uses one fixed 64x64 config.
"""

import torch
import triton
import triton.language as tl

from .. import runtime
from .config import cdiv, packed_dims, padded_headdim, prologue, size_bucket, tuned
from .launch import fast_launch, plan_key, remember
from .score_mod import alibi_bias, alibi_slope
from .score_mod import kernel_args as score_mod_args
from .tile import LOG2E, bounded_offset, finalize, key_range, tile_update_bounded, tile_update_split
from .tile import tile_update as tile_update_fn


@triton.jit
def attend_tile(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, cols, Nk, qk_scale,
                offs_d, D, visible, q_pos, bh, mod_args, pages, stride_kpage, stride_vpage,
                MASKED: tl.constexpr, BOUNDED: tl.constexpr, EVEN_D: tl.constexpr,
                DOT_PRECISION: tl.constexpr, TILE_UPDATE: tl.constexpr, SCORE_MOD: tl.constexpr,
                PAGE: tl.constexpr = 0, key_term=0.0, row_term=0.0, ALIBI_SPLIT: tl.constexpr = False):
    """Fold the key/value tile at columns ``cols`` (BN,) into the state: load, score, update.

    The scores go through SCORE_MOD (``kernels.score_mod``: q_pos (BM,) the rows' positions on the
    key axis, bh the (batch, query head) row of ``mod_args``, a scalar or (BM, 1)), then the mask.
    MASKED: scores outside ``visible`` (BM, BN) become -inf. BOUNDED: loads stop at Nk (a tile
    that may reach past the last key). A full tile inside Nk skips both. Shared with block-sparse,
    whose partial tiles are masked but, when Nk fills the last block, not bounded.
    PAGE > 0 (decode's paged KV cache): key j is row j % PAGE of page ``pages[j // PAGE - cols[0] //
    PAGE]``, ``pages`` the tile's page ids (``tile_page_ids``), pages ``stride_kpage`` /
    ``stride_vpage`` apart; otherwise row j of the cache.
    ALIBI_SPLIT: ALiBi alone, every key of the tile at or before every query: the bias is
    key_term (BN,) + row_term (BM,) (``attend_key_blocks``), the hook is not called.
    """
    if PAGE:
        # one table entry per page of the tile (``tile_page_ids``) broadcast to its keys, not one
        # per key, which cost the loop a third more instructions (sm90 SASS, NOTES.md); PAGE < BN
        # here: a tile inside one page takes ``attend_key_blocks``'s contiguous path
        NP: tl.constexpr = cols.shape[0] // PAGE
        page = tl.reshape(tl.broadcast_to(pages[:, None], (NP, PAGE)), (NP * PAGE,))     # (BN,)
        k_rows = page * stride_kpage + (cols % PAGE) * stride_kn
        v_rows = page * stride_vpage + (cols % PAGE) * stride_vn
    else:
        k_rows = cols * stride_kn
        v_rows = cols * stride_vn
    kt_ptrs = k_base + k_rows[None, :] + offs_d[:, None]              # (BD, BN): K^T
    v_ptrs = v_base + v_rows[:, None] + offs_d[None, :]               # (BN, BD)
    if BOUNDED:
        kt = tl.load(kt_ptrs, mask=(cols[None, :] < Nk) & (offs_d[:, None] < D), other=0.0)
        v = tl.load(v_ptrs, mask=(cols[:, None] < Nk) & (offs_d[None, :] < D), other=0.0)
    elif EVEN_D:
        kt = tl.load(kt_ptrs)
        v = tl.load(v_ptrs)
    else:
        kt = tl.load(kt_ptrs, mask=offs_d[:, None] < D, other=0.0)
        v = tl.load(v_ptrs, mask=offs_d[None, :] < D, other=0.0)
    s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale      # (BM, BN), base 2
    if ALIBI_SPLIT:   # one FFMA per score, as the plain kernel's multiply; the row term on the max
        acc, m_i, l_i = tile_update_split(acc, m_i, l_i, s + key_term[None, :], row_term, v,
                                          DOT_PRECISION)
    else:
        s, _ = SCORE_MOD(s, q_pos[:, None], cols[None, :], bh, mod_args)
        if MASKED:
            s = tl.where(visible, s, float("-inf"))
        acc, m_i, l_i = TILE_UPDATE(acc, m_i, l_i, s, v, DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def tile_page_ids(pages, start_n, Nk, BLOCK_N: tl.constexpr, PAGE: tl.constexpr):
    """The block table entries of the key tile starting at ``start_n`` (a multiple of BLOCK_N), as
    int64: one (a scalar) where the tile lies in one page, else (BLOCK_N // PAGE,); 0 for pages at
    or past Nk (their keys are not read)."""
    if PAGE >= BLOCK_N:
        return tl.load(pages + start_n // PAGE, mask=start_n < Nk, other=0).to(tl.int64)
    else:
        first = start_n // PAGE + tl.arange(0, BLOCK_N // PAGE)                           # (NP,)
        return tl.load(pages + first, mask=first * PAGE < Nk, other=0).to(tl.int64)


@triton.jit
def attend_key_blocks(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn,
                       lo, hi, Nk, causal_offset, qk_scale, offs_m, offs_n, offs_d, D, bh, mod_args,
                       MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                       BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, TILE_UPDATE: tl.constexpr,
                       SCORE_MOD: tl.constexpr, pages=0, stride_kpage=0, stride_vpage=0,
                       PAGE: tl.constexpr = 0, ALIBI_SPLIT: tl.constexpr = False,
                       IDS_AHEAD: tl.constexpr = False):
    """Stream key/value blocks [lo, hi) through the tile update; MASKED for ragged/diagonal ones.
    pages, stride_*page, PAGE: a paged cache (decode), ``pages`` this sequence's block table row.
    IDS_AHEAD: each tile's page ids are loaded in the iteration before (its K/V addresses then
    come from registers the loop carries). With the ids loaded in the tile's own iteration,
    Triton 3.6's software pipeline for sm90 holds one K/V tile in flight and waits for it each
    iteration; with them one ahead, two, as for a contiguous cache (TTGIR; NOTES.md).
    ALIBI_SPLIT (SCORE_MOD is ALiBi alone; blocks wholly at or before every row's diagonal, the
    causal unmasked ones): -slope (q - k) = slope (k - start_n) + slope (start_n - q), a key term
    the same for every block and a row term per block, anchored at the block's first key so that
    both stay small where the scores count (the Hopper forward's split, ``fa3_fwd._scores``)."""
    q_pos = offs_m + causal_offset                                        # (BM,) on the key axis
    key_term = 0.0
    if ALIBI_SPLIT:
        slope = alibi_slope(bh, mod_args)
        key_term = offs_n.to(tl.float32) * slope                          # (BN,)
    ids = 0
    if PAGE and IDS_AHEAD:
        ids = tile_page_ids(pages, lo, Nk, BLOCK_N, PAGE)                 # the first tile's
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n                                           # (BN,)
        tile_ids = ids
        if PAGE and IDS_AHEAD:
            ids = tile_page_ids(pages, start_n + BLOCK_N, Nk, BLOCK_N, PAGE)  # the next tile's
        elif PAGE:
            tile_ids = tile_page_ids(pages, start_n, Nk, BLOCK_N, PAGE)
        visible = cols[None, :] < Nk                                      # (1, BN)
        row_term = 0.0
        if ALIBI_SPLIT:
            row_term = (start_n - q_pos).to(tl.float32) * slope               # (BM,), <= 0
        if CAUSAL:
            visible = visible & (cols[None, :] <= q_pos[:, None])             # (BM, BN)
        if PAGE >= BLOCK_N:
            # the tile lies in one page (tiles start at multiples of their size): one page id
            # per tile, and the bases shifted so that key j's row of the cache is row j of the
            # page, addressed as a contiguous cache's (per-row 64-bit addresses cost the loop
            # twice the instructions: SASS for sm90)
            rows = (start_n // PAGE * PAGE).to(tl.int64)
            acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base + (tile_ids * stride_kpage - rows * stride_kn),
                                        v_base + (tile_ids * stride_vpage - rows * stride_vn), stride_kn,
                                        stride_vn, cols, Nk, qk_scale, offs_d, D, visible, q_pos, bh,
                                        mod_args, pages, stride_kpage, stride_vpage, MASKED, MASKED,
                                        EVEN_D, DOT_PRECISION, TILE_UPDATE, SCORE_MOD, 0)
        else:
            acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, cols, Nk,
                                        qk_scale, offs_d, D, visible, q_pos, bh, mod_args, tile_ids,
                                        stride_kpage, stride_vpage, MASKED, MASKED, EVEN_D,
                                        DOT_PRECISION, TILE_UPDATE, SCORE_MOD, PAGE, key_term,
                                        row_term, ALIBI_SPLIT)
    return acc, m_i, l_i


@triton.jit
def load_rows(base, offs_m, offs_d, stride_m, N, D, EVEN: tl.constexpr):
    """Rows ``offs_m`` (BM,) of a (N, D) matrix as a (BM, BD) tile, zeros past N and D."""
    ptrs = base + offs_m[:, None] * stride_m + offs_d[None, :]
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(offs_m[:, None] < N) & (offs_d[None, :] < D), other=0.0)


@triton.jit
def sequence(CuSeqQ, CuSeqK, off_b, Nq, Nk, VARLEN: tl.constexpr):
    """Where batch entry ``off_b``'s rows start and how many there are: ``(q0, Nq, k0, Nk)``.

    Dense: every entry has the kernel's Nq and Nk rows from row 0 (q0 = k0 = 0). VARLEN (packed
    sequences, flash-attn's layout): rows [cu[b], cu[b + 1]) of the packed tensors, as int64.
    """
    if VARLEN:
        q0 = tl.load(CuSeqQ + off_b).to(tl.int64)
        k0 = tl.load(CuSeqK + off_b).to(tl.int64)
        Nq = (tl.load(CuSeqQ + off_b + 1) - q0).to(tl.int32)
        Nk = (tl.load(CuSeqK + off_b + 1) - k0).to(tl.int32)
    else:
        q0 = 0
        k0 = 0
    return q0, Nq, k0, Nk


@triton.jit
def lse_rows(Lse, off_b, off_h, Hq, Nq, q0, total_q, VARLEN: tl.constexpr):
    """Where (batch entry, query head)'s lse rows start: (B, Hq, Nq) dense, (Hq, total_q) VARLEN."""
    if VARLEN:
        return Lse + off_h.to(tl.int64) * total_q + q0
    return Lse + (off_b * Hq + off_h).to(tl.int64) * Nq


@triton.jit
def write_output(out_base, lse_base, acc, m_i, l_i, stride_om, offs_m, offs_d, Nq, D,
                 EVEN_M: tl.constexpr, EVEN_D: tl.constexpr):
    """Normalise the state once and store out (BM, BD) and lse (BM,) of one query block; the bases
    point to this (batch, head)'s row 0."""
    out, lse = finalize(acc, m_i, l_i)
    o_ptrs = out_base + offs_m[:, None] * stride_om + offs_d[None, :]
    lse_ptrs = lse_base + offs_m
    if EVEN_M and EVEN_D:
        tl.store(o_ptrs, out.to(out_base.dtype.element_ty))
    else:
        tl.store(o_ptrs, out.to(out_base.dtype.element_ty),
                 mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < D))
    if EVEN_M:
        tl.store(lse_ptrs, lse)
    else:
        tl.store(lse_ptrs, lse, mask=offs_m < Nq)


@triton.jit
def _fa2_fwd_kernel(Q, K, V, Out, Lse, ModArgs, CuSeqQ, CuSeqK,
                    stride_qb, stride_qh, stride_qm,
                    stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn,
                    stride_ob, stride_oh, stride_om,
                    Hq, Nq, Nk, D, qk_scale, m_init, n_bucket, total_q,
                    GROUP, CAUSAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    EVEN_M: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    TILE_UPDATE: tl.constexpr, SCORE_MOD: tl.constexpr, VARLEN: tl.constexpr,
                    ALIBI_SPLIT: tl.constexpr):
    # one flat grid axis (CUDA caps axes 1 and 2 at 65535 programs; B x H can exceed that),
    # query blocks of one (batch, head) adjacent so they share its K/V in L2. VARLEN: Nq and Nk
    # are the longest sequence's, the grid covers it, and each entry's come from cu_seqlens.
    # m_init: the running max's start, -inf; tile.tile_update_bounded's fixed offset.
    # ALIBI_SPLIT: causal ALiBi alone, its bias split in the unmasked blocks (attend_key_blocks).
    n_m = tl.cdiv(Nq, BLOCK_M)
    pid_m = tl.program_id(0) % n_m
    off_bh = tl.program_id(0) // n_m
    if CAUSAL:  # heavy query blocks first: under causal masking the last blocks see the most keys
        pid_m = n_m - 1 - pid_m
    off_b = off_bh // Hq
    off_h = off_bh % Hq
    off_hkv = off_h // GROUP                      # grouped-query: GROUP query heads share K/V
    start_m = pid_m * BLOCK_M
    q0, Nq, k0, Nk = sequence(CuSeqQ, CuSeqK, off_b, Nq, Nk, VARLEN)
    if VARLEN:
        if start_m >= Nq:                         # past this sequence's last query block
            return
    offs_m = start_m + tl.arange(0, BLOCK_M)      # (BM,)
    offs_n = tl.arange(0, BLOCK_N)                # (BN,)
    offs_d = tl.arange(0, BLOCK_D)                # (BD,)

    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh + q0 * stride_qm
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh + k0 * stride_kn
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh + k0 * stride_vn
    q = load_rows(q_base, offs_m, offs_d, stride_qm, Nq, D, EVEN_M and EVEN_D)   # (BM, BD)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + m_init
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # key range: [0, n_full) needs no mask; [n_full, hi) is the diagonal band and/or ragged tail
    causal_offset = Nk - Nq
    n_full, hi = key_range(start_m, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    acc, m_i, l_i = attend_key_blocks(
        acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, 0, n_full, Nk,
        causal_offset, qk_scale, offs_m, offs_n, offs_d, D, off_bh, ModArgs,
        False, CAUSAL, EVEN_D, BLOCK_N, DOT_PRECISION, TILE_UPDATE, SCORE_MOD, ALIBI_SPLIT=ALIBI_SPLIT)
    if n_full < hi:   # a branch: even an empty loop sets up its software pipeline
        acc, m_i, l_i = attend_key_blocks(
            acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, n_full, hi, Nk,
            causal_offset, qk_scale, offs_m, offs_n, offs_d, D, off_bh, ModArgs,
            True, CAUSAL, EVEN_D, BLOCK_N, DOT_PRECISION, TILE_UPDATE, SCORE_MOD)

    out_base = Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh + q0 * stride_om
    write_output(out_base, lse_rows(Lse, off_b, off_h, Hq, Nq, q0, total_q, VARLEN), acc, m_i, l_i,
                 stride_om, offs_m, offs_d, Nq, D, EVEN_M, EVEN_D)


# (BLOCK_M, BLOCK_N, num_warps, num_stages); the first is used when autotuning is off
CONFIGS = [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 4, 4),
           (128, 128, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 4, 3), (64, 64, 4, 2),
           (64, 32, 4, 2), (32, 32, 4, 1)]
# SRAM: the Q block stays resident; each pipeline stage holds a K and a V block
_choose = tuned(_fa2_fwd_kernel, CONFIGS, lambda bm, bn: (bm, 2 * bn))


def fa2_forward(q, k, v, *, causal=False, scale=None, allow_tf32=False, tile_update=None,
                score_mod=None, cu_seqlens=None, max_seqlen=None, options=None):
    """Launch the FA2 forward kernel. Returns ``(out, lse)``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D). out: like q; lse: (B, Hq, Nq) float32, natural
    log, -inf for rows with nothing to attend to. Inputs are validated by ``flashlib.ops``;
    this launcher only needs the last dim contiguous.
    allow_tf32: float32 dots on TF32 tensor cores (faster, ~1e-3 relative error) instead of ieee.
    tile_update: a ``@triton.jit`` function with the signature of ``kernels.tile.tile_update``
    to use in the inner loop instead (lesson 07's exercise plugs a learner's version in here).
    score_mod: a ``kernels.score_mod.ScoreMod`` (softcap, ALiBi); None: the scores as they are.
    One with a bound (a softcap alone) and P in bfloat16 or float32 runs without the softmax's
    running max (``tile.tile_update_bounded``), unless ``tile_update`` is given.
    cu_seqlens=(cu_q, cu_k), max_seqlen=(max_q, max_k): packed sequences (flash-attn's varlen
    layout): q (total_q, Hq, D), k, v (total_k, Hkv, D), sequence b in rows [cu[b], cu[b + 1]);
    then out is like q and lse (Hq, total_q). options: a ``runtime.KernelOptions`` (None: those
    in force).
    """
    options = runtime.OPTIONS if options is None else options
    runtime.check_kernel(_fa2_fwd_kernel)
    mod_args, mod_fn, input_scale = score_mod_args(score_mod, None)
    m_init = (None if tile_update is not None or score_mod is None or score_mod.bound is None
              else bounded_offset(score_mod.bound, v.dtype))   # not None: no running max
    pointers = (q, k, v, *(cu_seqlens or ()), *([] if mod_args is None else [mod_args]))
    extra = (causal, scale, allow_tf32, tile_update, mod_fn, input_scale, max_seqlen, m_init)
    key = plan_key(pointers, extra, options)
    plan = _plans.get(key)
    if plan is not None:   # a call like an earlier one: allocate and replay its launch
        launch, lse_shape = plan
        out = torch.empty_like(q)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
        launch(q, k, v, out, lse, lse if mod_args is None else mod_args, *(cu_seqlens or (lse, lse)))
        return out, lse
    (q, k, v), scale, precision, out_dtype = prologue(q, k, v, scale=scale, allow_tf32=allow_tf32)
    dims = packed_dims(q, k, cu_seqlens, max_seqlen)
    B, Hq, Hkv, Nq, Nk, D = dims.sizes
    out = torch.empty_like(q)
    lse = torch.empty(dims.lse_shape, dtype=torch.float32, device=q.device)
    block_d = padded_headdim(D)
    kernel, config = _choose(block_d, q.element_size(), B * Hq * Nq * Nk, autotune=runtime.autotuning(options))
    even_m = dims.cu_q is None and all(
        Nq % bm == 0 for bm in ([config["BLOCK_M"]] if config else {c[0] for c in CONFIGS}))

    def grid(meta):
        return (cdiv(Nq, meta["BLOCK_M"]) * B * Hq,)

    launch = fast_launch(
        kernel, grid, q, k, v, out, lse, lse if mod_args is None else mod_args, *dims.offsets(lse),
        *dims.strides(q), *dims.strides(k), *dims.strides(v), *dims.strides(out),
        Hq, Nq, Nk, D, scale * LOG2E * input_scale, float("-inf") if m_init is None else m_init,
        size_bucket(Nq, Nk, slices=B * Hq), dims.total_q, GROUP=Hq // Hkv, CAUSAL=bool(causal), BLOCK_D=block_d,
        EVEN_M=even_m, EVEN_D=(D == block_d),
        DOT_PRECISION=precision,
        TILE_UPDATE=(tile_update if tile_update is not None else tile_update_fn if m_init is None
                     else tile_update_bounded), SCORE_MOD=mod_fn,
        VARLEN=dims.cu_q is not None,
        ALIBI_SPLIT=bool(causal) and mod_fn is alibi_bias and tile_update is None, **config,
        kernel_options=options)
    remember(_plans, key, (launch, dims.lse_shape))
    return out.to(out_dtype), lse


_plans = {}   # launch.plan_key -> (Launch, lse shape)
