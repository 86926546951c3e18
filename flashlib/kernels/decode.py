"""Flash-Decoding in Triton: split-KV attention of a few new query tokens over a long KV cache.

Follows Dao, Haziza, Massa and Sizov, "Flash-Decoding for long-context inference" (2023), on top
of FlashAttention-2's inner loop (Dao 2023, Algorithm 1):
- with one new token per sequence, FA2's grid (query blocks x batch x heads) has only B * H
  programs, too few to fill a GPU; Flash-Decoding also splits the keys: each sequence's cache is
  cut into ``num_splits`` chunks of whole key blocks, and one program per (batch x KV head, row
  block, split) runs FA2's loop (``kernels.tile.tile_update``) over its chunk;
- each program writes its normalised partial output and its lse (natural log, float32), and the
  splits of every query row are merged by their lse, lesson 03's merge (``merge_splits``):
  lse = logsumexp_s(lse_s), out = sum_s exp(lse_s - lse) * out_s. An empty split (past its
  sequence's length) has out 0 and lse -inf, so its weight is exactly 0; a row with nothing to
  attend to gets out 0 and lse -inf, never NaN. The merge is a second kernel (``combine``, as
  the post and lesson 10 present it) or, in ``flash_decode_forward``, the same launch: each
  program bumps an arrival counter of its row block after its stores, and the last to arrive
  merges (no program waits for another). One launch instead of two halves the host's time per
  decoding step, which at short caches is longer than the GPU's; with one split there is
  nothing to merge and the result is written directly;
- grouped-query heads: the GROUP query heads that share a K/V head, times the new tokens, are the
  rows of one tile (row r = g * Nq + i), so each K/V block is read once per group, not once per
  query head;
- ragged batches: sequence b has ``cache_seqlens[b]`` valid keys, split evenly over the programs
  of that sequence; the new tokens are the last Nq positions, bottom-right causal among them (new
  token i sees key j iff j <= i + L - Nq);
- appending in the same launch (flash-attn's ``flash_attn_with_kvcache(k=, v=)``; ``_launch``'s
  ``append``): the Nq new tokens' keys and values go to positions [L, L + Nq) of the cache first.
  The program whose chunk holds a new position writes it, then reads it: only that chunk's
  programs read it, so no program waits for another; one program per sequence writes L + Nq to a
  second lengths tensor (the first is read by every program). It saves a decoding step the two
  cache writes and the lengths' increment, three launches of host time per layer.

Layout (batch, heads, seqlen, headdim) with any strides (a last dim that is not contiguous is
copied). Head dims up to 256, padded inside to a power of two (>= 16) and masked; float16,
bfloat16 and float32 (exact ``ieee`` dots). Key-block configs (``KEY_BLOCK_CONFIGS``,
``LONG_SPLIT_KEY_BLOCK``, ``SHORT_PAGE_KEY_BLOCK``) and a split heuristic (``num_splits_heuristic``)
chosen per GPU from sweeps and probes (``python -m flashlib.bench.decode_tuning --sweep``; the
numbers: benchmarks/probes/NOTES.md).
Limits: lengths are clamped to [0, Lmax] inside the kernel (``flashlib.decode.flash_decode``
checks them on the host only for CPU tensors, to keep a device sync out of every decoding step);
within one sequence and head, key offsets (position x row stride) must fit in int32.
"""
import functools
import threading

import torch
import triton
import triton.language as tl

from .. import runtime
from .config import cdiv, next_power_of_2, padded_headdim, prologue, smem_bytes, target
from . import launch
from .fa2_fwd import attend_key_blocks
from .launch import fast_launch
from .score_mod import kernel_args as score_mod_args
from .tile import LN2, LOG2E, finalize, tile_update

# (BLOCK_N, num_warps, num_stages) for the partial kernel, best first (the sweep at d=128, float16:
# python -m flashlib.bench.decode_tuning --sweep): the first whose K/V pipeline fits in
# shared memory is used. Through the interpreter, 32-key blocks: small caches still have blocks to split.
KEY_BLOCK_CONFIGS = [(64, 4, 3), (32, 4, 3), (64, 8, 3), (64, 4, 2), (32, 4, 2), (16, 4, 1)]
# ... except where each split streams at least LONG_SPLIT keys of that GPU (the H100's
# elsewhere): then 128-key blocks keep more bytes in flight, if they fit (the sweep's numbers:
# benchmarks/probes/NOTES.md)
LONG_SPLIT_KEY_BLOCK = (128, 4, 3)
LONG_SPLIT = {"h100": 1024, "h200": 512}
# ... and for pages shorter than the key tile on a grid of one wave: 8 warps, two a scheduler.
# Each key of such a tile has its own 64-bit address, computed after its page id's load; one
# program an SM with 4 warps leaves a scheduler one warp to hide that chain with. A program of
# one query row (MHA, one new token) does less work a tile and hides it with 4 warps: it takes
# LONG_SPLIT_KEY_BLOCK's 128-key tile instead (paged_group_probe.py configs; NOTES.md)
SHORT_PAGE_KEY_BLOCK = (128, 8, 3)
INTERPRETER_BLOCK_N = 32
MAX_ROWS = 64            # query rows per program (group x new tokens); more rows: more row blocks
MAX_SPLITS = 128         # the heuristic's cap; an explicit num_splits may be anything >= 1
MIN_BLOCKS_PER_SPLIT = 4  # the heuristic gives each split at least this many key blocks
PAGED_MIN_BLOCKS = 2      # ... paged caches this many, where it takes that to fill the SMs once
# ... and does not split a shorter cache in two (num_splits_heuristic); per GPU, from its sweep,
# the H100's value elsewhere: the H200's bandwidth needs more SMs busy sooner
SHORT_CACHE = {"h100": 8192, "h200": 1024}
MERGE_TILE = 8192        # float32 values per merge tile: 64 registers a thread at 4 warps
NOMINAL_SMS = 132        # SM count assumed through the interpreter (an H100's), for the counts


@triton.jit
def _decode_partial_kernel(Q, K, V, Seqlens, OPart, LsePart, Out, Lse, Arrivals, ModArgs, Pages,
                           KNew, VNew, SeqlensOut,
                           stride_qb, stride_qh, stride_qm,
                           stride_kb, stride_kh, stride_kn,
                           stride_vb, stride_vh, stride_vn,
                           stride_pb, stride_kpage, stride_vpage,
                           stride_knb, stride_knh, stride_knm,
                           stride_vnb, stride_vnh, stride_vnm,
                           Hkv, Nq, Lmax, D, qk_scale, num_splits, n_row_blocks, GROUP,
                           HAS_SEQLENS: tl.constexpr, CAUSAL: tl.constexpr, MERGE: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, EVEN_D: tl.constexpr,
                           DOT_PRECISION: tl.constexpr, TILE_UPDATE: tl.constexpr,
                           SCORE_MOD: tl.constexpr, PAGE: tl.constexpr,
                           APPEND: tl.constexpr = False, BLOCK_NEW: tl.constexpr = 1,
                           PAGE_IDS_AHEAD: tl.constexpr = False):
    # 1-D grid (CUDA caps grid axes 1 and 2 at 65535): (batch x kv head, row block, split),
    # split fastest. MERGE: the last split of each row block to finish also merges them all into
    # Out and Lse (one launch instead of two); otherwise Out, Lse and Arrivals are unused.
    # APPEND (contiguous caches, with Seqlens): KNew, VNew (B, Hkv, Nq, D) are appended first and
    # SeqlensOut gets the new lengths (see the module docstring); otherwise those are unused.
    pid = tl.program_id(0)
    split = pid % num_splits
    row_block = (pid // num_splits) % n_row_blocks
    off_bh = pid // (num_splits * n_row_blocks)   # b * Hkv + kv head
    off_b = off_bh // Hkv
    off_hkv = off_bh % Hkv

    rows = GROUP * Nq                                        # this group's query rows
    offs_r = row_block * BLOCK_M + tl.arange(0, BLOCK_M)     # (BM,) row r = g * Nq + i
    offs_g = offs_r // Nq                                    # (BM,) query head within the group
    offs_i = offs_r % Nq                                     # (BM,) new token
    # each row's (batch, query head), for the score modifier; padding rows take the group's last
    bh = (off_b * Hkv + off_hkv) * GROUP + tl.minimum(offs_g, GROUP - 1)   # (BM,)
    offs_n = tl.arange(0, BLOCK_N)                           # (BN,)
    offs_d = tl.arange(0, BLOCK_D)                           # (BD,)

    q_ptrs = (Q + off_b.to(tl.int64) * stride_qb
              + (off_hkv * GROUP + offs_g).to(tl.int64)[:, None] * stride_qh
              + offs_i[:, None] * stride_qm + offs_d[None, :])   # (BM, BD)
    q = tl.load(q_ptrs, mask=(offs_r[:, None] < rows) & (offs_d[None, :] < D), other=0.0)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    pages = Pages + off_b.to(tl.int64) * stride_pb       # PAGE: this sequence's block table row

    # this split's keys: [lo, hi) of the L valid ones, chunks of whole key blocks
    L = Lmax
    if HAS_SEQLENS:
        L = tl.minimum(tl.maximum(tl.load(Seqlens + off_b).to(tl.int32), 0), Lmax)
    start = L                                                 # APPEND: the new tokens' first position
    if APPEND:
        L = tl.minimum(L + Nq, Lmax)                          # the host checked there is room
    chunk = tl.cdiv(tl.cdiv(L, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, L)                            # hi <= lo: an empty split
    if APPEND:
        append_rows(KNew + off_b.to(tl.int64) * stride_knb + off_hkv.to(tl.int64) * stride_knh,
                    VNew + off_b.to(tl.int64) * stride_vnb + off_hkv.to(tl.int64) * stride_vnh,
                    k_base, v_base, stride_knm, stride_vnm, stride_kn, stride_vn, start, lo, hi, Nq,
                    offs_d, D, BLOCK_NEW)
        if (split == 0) & (row_block == 0) & (off_hkv == 0):  # one program per sequence
            tl.store(SeqlensOut + off_b, L.to(SeqlensOut.dtype.element_ty))
    # keys every row may see (bottom-right causal: token i sees j <= i + L - Nq) run unmasked
    seen_by_all = tl.minimum(hi, L - Nq + 1) if CAUSAL else hi
    n_full = lo + tl.maximum(seen_by_all - lo, 0) // BLOCK_N * BLOCK_N

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = attend_key_blocks(
        acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, lo, n_full, L,
        L - Nq, qk_scale, offs_i, offs_n, offs_d, D, bh[:, None], ModArgs,
        False, CAUSAL, EVEN_D, BLOCK_N, DOT_PRECISION, TILE_UPDATE, SCORE_MOD,
        pages, stride_kpage, stride_vpage, PAGE, False, PAGE_IDS_AHEAD)
    # a branch, not only an empty loop: the loop's software-pipeline set-up alone costs GPU time
    # at short caches (benchmarks/probes/NOTES.md)
    if n_full < hi:
        acc, m_i, l_i = attend_key_blocks(
            acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, n_full, hi, L,
            L - Nq, qk_scale, offs_i, offs_n, offs_d, D, bh[:, None], ModArgs,
            True, CAUSAL, EVEN_D, BLOCK_N, DOT_PRECISION, TILE_UPDATE, SCORE_MOD,
            pages, stride_kpage, stride_vpage, PAGE, False, PAGE_IDS_AHEAD)
    out, lse = finalize(acc, m_i, l_i)                        # empty split: 0 and -inf

    # partials are (B, Hq, Nq, S, D) and (B, Hq, Nq, S): a group's rows are contiguous
    row = off_bh.to(tl.int64) * rows + offs_r                 # (BM,) global query row
    row_mask = offs_r < rows
    if not MERGE:
        store_split(OPart, LsePart, out, lse, row, row_mask, split, num_splits, D, offs_d)
    elif num_splits == 1:                                     # nothing to merge: the result
        store_rows(Out, Lse, out, lse, row, row_mask, D, offs_d)
    else:
        store_split(OPart, LsePart, out, lse, row, row_mask, split, num_splits, D, offs_d)
        # every thread's stores above happen before the release below (a CTA barrier, then a
        # gpu-scope acq_rel atomic, as in a grid-wide sync); the program that arrives last
        # sees every split's stores and merges them. No program waits for another.
        tl.debug_barrier()
        arrived = tl.atomic_add(Arrivals + pid // num_splits, 1, sem="acq_rel")
        if arrived == num_splits - 1:
            merged, merged_lse = merge_splits(OPart, LsePart, row, row_mask, num_splits, D,
                                              offs_d, BLOCK_M, BLOCK_D, BLOCK_S)
            store_rows(Out, Lse, merged, merged_lse, row, row_mask, D, offs_d)
            tl.store(Arrivals + pid // num_splits, 0)   # every split has arrived: ready for reuse


@triton.jit
def append_rows(k_new, v_new, k_base, v_base, stride_knm, stride_vnm, stride_kn, stride_vn, start, lo,
                hi, Nq, offs_d, D, BLOCK_NEW: tl.constexpr):
    """Write the new tokens' keys and values (Nq rows at ``k_new``, ``v_new``) to positions
    [start, start + Nq) of this (batch, KV head)'s cache, those in this split's chunk [lo, hi):
    the program reads them next, and no other split reads them. Every row block of the split
    writes the same values (harmless); the barrier puts the stores before this program's loads."""
    offs_j = tl.arange(0, BLOCK_NEW)                                       # (BJ,) new token j
    pos = start + offs_j                                                   # (BJ,) its position
    mine = (offs_j < Nq) & (pos >= lo) & (pos < hi)
    mask = mine[:, None] & (offs_d[None, :] < D)                           # (BJ, BD)
    k = tl.load(k_new + offs_j[:, None] * stride_knm + offs_d[None, :], mask=mask)
    v = tl.load(v_new + offs_j[:, None] * stride_vnm + offs_d[None, :], mask=mask)
    tl.store(k_base + pos[:, None] * stride_kn + offs_d[None, :], k, mask=mask)
    tl.store(v_base + pos[:, None] * stride_vn + offs_d[None, :], v, mask=mask)
    tl.debug_barrier()


@triton.jit
def store_split(OPart, LsePart, out, lse, rows, row_mask, split, num_splits, D, offs_d):
    """Split ``split``'s out (BR, BD) and lse (BR,) of query rows ``rows`` into the partials."""
    tl.store(OPart + (rows[:, None] * num_splits + split) * D + offs_d[None, :], out,
             mask=row_mask[:, None] & (offs_d[None, :] < D))
    tl.store(LsePart + rows * num_splits + split, lse, mask=row_mask)


@triton.jit
def store_rows(Out, Lse, out, lse, rows, row_mask, D, offs_d):
    """The merged out (BR, BD), in Out's dtype, and lse (BR,) of query rows ``rows``."""
    tl.store(Out + rows[:, None] * D + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_mask[:, None] & (offs_d[None, :] < D))
    tl.store(Lse + rows, lse, mask=row_mask)


@triton.jit
def merge_splits(OPart, LsePart, rows, row_mask, num_splits, D, offs_d,
                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the S partial results of query rows ``rows`` (BR,) by their lse (lesson 03's merge,
    the running max and sum of lesson 02, over tiles of BLOCK_S splits: the loads of a tile are
    in flight together). Returns out (BR, BD) float32 and lse (BR,), natural log; a row whose
    every split is empty (lse_s = -inf) gets 0 and -inf."""
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)   # running max of lse_s, base 2
    total = tl.zeros([BLOCK_R], dtype=tl.float32)             # sum_s 2^(lse_s - m)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)     # sum_s 2^(lse_s - m) out_s
    offs_s = tl.arange(0, BLOCK_S)
    for s0 in range(0, num_splits, BLOCK_S):
        slot = rows[:, None] * num_splits + s0 + offs_s[None, :]            # (BR, BS)
        here = row_mask[:, None] & (s0 + offs_s[None, :] < num_splits)      # (BR, BS)
        # .cg: read from L2, where the other programs' stores are, never a stale L1 line
        lse_s = tl.load(LsePart + slot, mask=here, other=float("-inf"),
                        cache_modifier=".cg") / LN2                         # (BR, BS) base 2
        o_s = tl.load(OPart + slot[:, :, None] * D + offs_d[None, None, :],
                      mask=here[:, :, None] & (offs_d[None, None, :] < D), other=0.0,
                      cache_modifier=".cg")                                 # (BR, BS, BD)
        m_new = tl.maximum(m, tl.max(lse_s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: no NaN
        alpha = tl.math.exp2(m - m_safe)                      # (BR,) rescale of the old state
        w = tl.math.exp2(lse_s - m_safe[:, None])             # (BR, BS), 0 for an empty split
        total = total * alpha + tl.sum(w, 1)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o_s, 1)
        m = m_new
    return finalize(acc, m, total)                            # acc / total, (m + log2 total) ln 2


@triton.jit
def _combine_kernel(OPart, LsePart, Out, Lse, n_rows, num_splits, D,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the splits of BLOCK_R query rows (one (batch, head, new token) each) by their lse."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)   # (BR,)
    offs_d = tl.arange(0, BLOCK_D)                                          # (BD,)
    out, lse = merge_splits(OPart, LsePart, rows, rows < n_rows, num_splits, D, offs_d,
                            BLOCK_R, BLOCK_D, BLOCK_S)
    store_rows(Out, Lse, out, lse, rows, rows < n_rows, D, offs_d)


def merge_tile(num_splits, block_r, block_d):
    """Splits merged at a time (``merge_splits``' BLOCK_S): all of them, up to a tile of
    ``MERGE_TILE`` float32 values (BLOCK_R x BLOCK_S x BLOCK_D) in registers."""
    return max(1, min(next_power_of_2(num_splits), MERGE_TILE // (block_r * block_d)))


def block_n_for(block_d, elem_bytes):
    """The partial kernel's (BLOCK_N, num_warps, num_stages): the first config that fits SRAM."""
    return _first_fitting(block_d, elem_bytes, plan_target())


@functools.lru_cache(maxsize=None)
def _first_fitting(block_d, elem_bytes, gpu):
    """``block_n_for`` on ``gpu`` (a ``plan_target()``; None: the interpreter's block)."""
    if gpu is None:
        return INTERPRETER_BLOCK_N, 4, 1
    return next((c for c in KEY_BLOCK_CONFIGS if fits(c, block_d, elem_bytes, gpu)),
                KEY_BLOCK_CONFIGS[-1])


def fits(config, block_d, elem_bytes, gpu):
    """Whether config's K/V pipeline (and 16 query rows) fits in ``gpu``'s shared memory."""
    block_n, _, stages = config
    return smem_bytes(16, 2 * block_n, stages, block_d, elem_bytes, gpu) <= gpu.smem


@functools.lru_cache(maxsize=None)
def sm_count(device) -> int:
    """Multiprocessors of ``device``'s GPU; ``NOMINAL_SMS`` through the interpreter."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return NOMINAL_SMS


def for_gpu(table, device) -> int:
    """``table``'s value (``SHORT_CACHE``, ``LONG_SPLIT``) for ``device``'s GPU; the H100's for a
    GPU not swept, and on CPU."""
    name = runtime.gpu_name(device)
    return next((keys for gpu, keys in table.items() if gpu in name), table["h100"])


def num_splits_heuristic(batch, heads_kv, row_blocks, max_len, *, block_n, sms, ragged=False,
                         short_cache=SHORT_CACHE["h100"], page=0, short_page_tile=False):
    """Splits per sequence. Equal lengths: as many as fit one program per SM (one wave, each
    program streaming one long chunk through its software pipeline; the sweep's best).
    Lengths given (``ragged``): 8x that, so that the long sequences' chunks spread over the SMs
    the short ones leave idle. At least 1, at most ``MAX_SPLITS``, no split shorter than
    ``MIN_BLOCKS_PER_SPLIT`` key blocks. Exception: a cache under ``short_cache`` keys whose
    unsplit grid already busies half the SMs is not split in two: there the merge costs more than
    the SMs it adds. How short depends on the GPU (``SHORT_CACHE``, from each GPU's sweep:
    benchmarks/probes/NOTES.md).

    ``page`` (a paged cache's page size; 0: contiguous): pages as long as a key tile fill one
    program an SM, where splits of ``PAGED_MIN_BLOCKS`` key blocks allow it; so do shorter pages
    where their 128-key tile can run them (``short_page_tile``: ``_plan`` says so for compiled
    kernels where it fits), else two programs an SM. A grid of one wave at most loads
    each tile's page ids a tile ahead (``page_ids_ahead``), which keeps two K/V tiles in flight as
    a contiguous cache does; short pages there need that tile's 8 warps (a program of one query
    row, 4), or else a second program on the SM to hide the wait for the ids
    (benchmarks/probes/paged_split_probe.py and paged_group_probe.py; their numbers in NOTES.md)."""
    programs = max(1, batch * heads_kv * row_blocks)
    longest = cdiv(max_len, block_n * MIN_BLOCKS_PER_SPLIT)
    splits = max(1, min(sms // programs * (8 if ragged else 1), longest, MAX_SPLITS))
    if page:
        per_sm = 1 if page >= block_n or short_page_tile else 2
        splits = max(splits, min(per_sm * sms // programs, cdiv(max_len, block_n * PAGED_MIN_BLOCKS), MAX_SPLITS))
    splits = 1 if splits == 2 and max_len < short_cache else splits
    return splits


def launch_plan(q, k_cache, cache_seqlens=None, *, num_splits=None, config=None, block_table=None,
                longest=None, ragged=None):
    """What ``decode_partial`` launches: (BLOCK_M, row blocks, (BLOCK_N, num_warps, num_stages),
    num_splits), from the shapes (and ``num_splits_heuristic`` unless num_splits is given).
    longest, ragged: what the caller knows on the host about ``cache_seqlens``' values (a
    ``KVCache`` keeps a host copy): the longest length, whether they differ. The split count is
    then sized for the lengths in the cache rather than its capacity; None assumes the worst
    (every sequence as long as the cache, ragged whenever lengths are given)."""
    B, Hq, Nq, D = q.shape
    split_length, ragged = split_sizing(cache_length(k_cache, block_table), cache_seqlens, longest, ragged)
    return _plan(B, Hq, Nq, D, k_cache.shape[1], split_length, q.element_size(), q.device,
                 ragged, page_size(k_cache, block_table), num_splits, config, plan_target())


SPLIT_LENGTH_STEP = 256   # host lengths are rounded up to this: the plan changes every 256 tokens


def page_size(k_cache, block_table=None) -> int:
    """Positions a page holds, (num_pages, Hkv, page_size, D) with a table; 0: a contiguous cache."""
    return 0 if block_table is None else k_cache.shape[2]


def page_ids_ahead(grid, sms, options) -> bool:
    """Whether a paged launch of ``grid`` programs loads each key tile's page ids a tile ahead:
    where the grid is one wave at most, a program alone on its SM has no neighbour to hide the
    wait for its ids, and loading them a tile ahead lets Triton's pipeline keep two K/V tiles in
    flight. With more programs an SM, the shallower pipeline wins (its shared memory is about
    half) and the neighbours hide the wait. ``options.decode_page_ids_ahead`` False: never."""
    return options.decode_page_ids_ahead and grid <= sms


def split_sizing(Lmax, cache_seqlens=None, longest=None, ragged=None):
    """(keys the split count is sized for, ragged) from ``launch_plan``'s hints. The longest
    length is rounded up to ``SPLIT_LENGTH_STEP`` so that a decoding loop, one token longer at
    every step, keeps asking for the same plan; a hint can only make the split count worse,
    never the result wrong (the kernel splits the lengths it reads, whatever the count)."""
    if cache_seqlens is None:
        return Lmax, False
    if longest is not None:
        Lmax = min(Lmax, max(1, cdiv(longest, SPLIT_LENGTH_STEP)) * SPLIT_LENGTH_STEP)
    return Lmax, True if ragged is None else bool(ragged)


def cache_length(k_cache, block_table=None):
    """Lmax, the positions a sequence's cache can hold: (B, Hkv, Lmax, D) contiguous, or
    max_pages x page_size for pages (num_pages, Hkv, page_size, D) and a (B, max_pages) table."""
    return k_cache.shape[2] * (1 if block_table is None else block_table.shape[1])


def plan_target():
    """What a plan is chosen for besides the shapes: the GPU configs are fitted to (``target()``),
    or None through the interpreter. Part of ``_plan``'s memo key."""
    return None if runtime.INTERPRET else target()


@functools.lru_cache(maxsize=4096)  # a decoding loop asks for the same plan at every step
def _plan(B, Hq, Nq, D, Hkv, Lmax, elem_bytes, device, ragged, page, num_splits, config, gpu):
    rows = Hq // Hkv * Nq
    block_m = max(16, min(MAX_ROWS, next_power_of_2(rows)))
    row_blocks = cdiv(rows, block_m)
    block_d, chosen = padded_headdim(D), config is None
    if chosen:
        config = _first_fitting(block_d, elem_bytes, gpu)
    short_tile = LONG_SPLIT_KEY_BLOCK if rows == 1 else SHORT_PAGE_KEY_BLOCK
    short_page_tile = bool(chosen and page and gpu is not None and fits(short_tile, block_d, elem_bytes, gpu))
    if num_splits is None:
        num_splits = num_splits_heuristic(B, Hkv, row_blocks, Lmax, block_n=config[0],
                                          sms=sm_count(device), ragged=ragged,
                                          short_cache=for_gpu(SHORT_CACHE, device), page=page,
                                          short_page_tile=short_page_tile)
    long_split = cdiv(Lmax, num_splits) >= for_gpu(LONG_SPLIT, device)
    if chosen and long_split and gpu is not None and fits(LONG_SPLIT_KEY_BLOCK, block_d, elem_bytes, gpu):
        config = LONG_SPLIT_KEY_BLOCK
    one_wave = B * Hkv * row_blocks * num_splits <= sm_count(device)
    if short_page_tile and page < config[0] and one_wave:
        config = short_tile
    return block_m, row_blocks, tuple(config), num_splits


def _launch(q, k_cache, v_cache, cache_seqlens, num_splits, scale, config, *, merge_into=None,
            cached_scratch=True, score_mod=None, block_table=None, options=None, longest=None,
            ragged=None, append=None):
    """Run the split-KV kernel; return (o_part, lse_part). merge_into=(out, lse): also merge the
    splits into them (the last split of each row block does it) and keep the partials in the
    stream's workspace (None is returned for them); lse None: it goes to the workspace too.
    cached_scratch=False: the workspace is fresh buffers (see ``workspace``). block_table: the
    caches are pages (see ``flashlib.decode.flash_decode``). options: a ``runtime.KernelOptions``
    (None: those in force). longest, ragged: ``launch_plan``'s host hints (the lengths after an
    append). append: None, or (k_new, v_new, seqlens_out), k_new and v_new (B, Hkv, Nq, D) like
    the caches, to write at each sequence's length first (contiguous caches, cache_seqlens given,
    room checked by the caller); seqlens_out (B,) gets cache_seqlens + Nq.

    A decoding loop makes the same call at every step, only the lengths' values change: the
    first call of each ``launch.plan_key`` records its launch and sizes, and later ones only find
    their buffers and replay it (as ``fa2_forward``'s plans), skipping the prologue, the plan and
    ``fast_launch``'s signature of some forty arguments."""
    options = runtime.OPTIONS if options is None else options
    runtime.check_kernel(_decode_partial_kernel)
    mod_args, mod_fn, input_scale = score_mod_args(score_mod, None)   # None: no modifier's args
    split_length, ragged = split_sizing(cache_length(k_cache, block_table), cache_seqlens, longest, ragged)
    lse_given = merge_into is not None and merge_into[1] is not None
    extra = (num_splits, scale, config, split_length, ragged, merge_into is not None, lse_given,
             cache_seqlens is not None, block_table is not None, mod_fn, input_scale, append is not None)
    tensors = (q, k_cache, v_cache, *(t for t in (cache_seqlens, block_table, mod_args, *(append or ()))
                                      if t is not None))
    key = launch.plan_key(tensors, extra, options)
    plan = _plans.get(key)
    if plan is not None:
        recorded, sizes = plan
        buffers = _buffers(q, sizes, merge_into, cached_scratch)
        recorded(*_pointers(q, k_cache, v_cache, cache_seqlens, buffers, mod_args, block_table, append))
        return (None, None) if merge_into is not None else buffers[:2]
    if append is not None and (block_table is not None or cache_seqlens is None
                               or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1):
        raise ValueError("append needs caches with a contiguous last dim (not pages) and cache_seqlens")
    (q, k_cache, v_cache), scale, _, _ = prologue(q, k_cache, v_cache, scale=scale)
    B, Hq, Nq, D = q.shape
    Hkv, Lmax = k_cache.shape[1], cache_length(k_cache, block_table)
    block_d = padded_headdim(D)
    block_m, row_blocks, (block_n, warps, stages), num_splits = _plan(
        B, Hq, Nq, D, Hkv, split_length, q.element_size(), q.device, ragged, page_size(k_cache, block_table),
        num_splits, config, plan_target())
    if block_table is None:   # (batch, head, row) strides; no pages
        cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3], 0, 0, 0)
    else:                     # pages: no batch stride, the table says where each page is
        cache_strides = (0, *k_cache.stride()[1:3], 0, *v_cache.stride()[1:3],
                         block_table.stride(0), k_cache.stride(0), v_cache.stride(0))
    grid = (B * Hkv * row_blocks * num_splits,)
    sizes = (B, Hq, Nq, D, Hkv, row_blocks, num_splits)
    o_part, lse_part, out, lse, arrivals = buffers = _buffers(q, sizes, merge_into, cached_scratch)
    recorded = None
    if grid[0] > 0:
        new_strides = (0,) * 6 if append is None else (*append[0].stride()[:3], *append[1].stride()[:3])
        recorded = fast_launch(
            _decode_partial_kernel, grid,
            *_pointers(q, k_cache, v_cache, cache_seqlens, buffers, mod_args, block_table, append),
            *q.stride()[:3], *cache_strides, *new_strides,
            Hkv, Nq, Lmax, D, scale * LOG2E * input_scale, num_splits, row_blocks, Hq // Hkv,
            HAS_SEQLENS=cache_seqlens is not None, CAUSAL=Nq > 1, MERGE=merge_into is not None,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
            BLOCK_S=merge_tile(num_splits, block_m, block_d) if arrivals is not None else 1,
            EVEN_D=(D == block_d),
            DOT_PRECISION="ieee", TILE_UPDATE=tile_update, SCORE_MOD=mod_fn,
            PAGE=page_size(k_cache, block_table), APPEND=append is not None,
            BLOCK_NEW=next_power_of_2(Nq),
            PAGE_IDS_AHEAD=block_table is not None and page_ids_ahead(grid[0], sm_count(q.device), options),
            num_warps=warps, num_stages=stages, kernel_options=options)
    launch.remember(_plans, key, (recorded, sizes))
    return (None, None) if merge_into is not None else (o_part, lse_part)


def _pointers(q, k_cache, v_cache, cache_seqlens, buffers, mod_args, block_table, append=None):
    """The partial kernel's tensor arguments in order, q standing in for those a launch has none
    of (the kernel never reads them: its constexprs say so)."""
    optional = (cache_seqlens, *buffers, mod_args, block_table, *(append or (None,) * 3))
    return (q, k_cache, v_cache, *(q if t is None else t for t in optional))


def _buffers(q, sizes, merge_into, cached_scratch):
    """(o_part, lse_part, out, lse, arrivals) of a launch of ``sizes`` (B, Hq, Nq, D, Hkv, row
    blocks, splits), None where the launch has none: the partials as new tensors, or, merging
    into merge_into=(out, lse), whatever scratch it needs from ``workspace``."""
    B, Hq, Nq, D, Hkv, row_blocks, num_splits = sizes
    if merge_into is None:
        o_part = torch.empty((B, Hq, Nq, num_splits, D), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((B, Hq, Nq, num_splits), dtype=torch.float32, device=q.device)
        return o_part, lse_part, None, None, None
    out, lse = merge_into
    rows = B * Hq * Nq
    needs = {"lse": rows} if lse is None else {}
    if num_splits > 1:
        needs.update(o_part=rows * num_splits * D, lse_part=rows * num_splits, arrivals=B * Hkv * row_blocks)
    if not needs:
        return None, None, out, lse, None
    scratch = workspace(q.device, needs, cached=cached_scratch)   # may hold other roles too
    o_part, lse_part, arrivals = (scratch[role] if role in needs else None
                                  for role in ("o_part", "lse_part", "arrivals"))
    return o_part, lse_part, out, scratch["lse"] if lse is None else lse, arrivals


_plans = {}   # launch.plan_key -> (Launch, sizes), see _launch


_workspaces = {}       # (device index, stream) -> {role: flat buffer}
_graph_counters = {}   # device index -> [zeroed int32 buffer, first free counter]
_graph_counters_lock = threading.Lock()   # two threads capturing at once get distinct slices
GRAPH_COUNTERS = 1 << 16


def workspace(device, needs, *, cached=True):
    """Scratch buffers of the one-launch path, ``needs`` = {role: elements}: "o_part", "lse_part",
    "lse" (one nobody asked for), float32, and "arrivals", int32 counters, zero before a launch
    (the merging program sets its row block's counter back to 0). Returns {role: buffer}, each at
    least that long.

    Eager calls: kept per stream and grown as needed, three allocations fewer per decoding step
    (each microseconds of host time); launches on one stream run one after another, so
    they can share them. Under CUDA graph capture every call gets fresh buffers (the graph keeps
    them), so no two graphs share one. Its counters are a slice of a per-device pool zeroed once,
    at the first eager call on the device: zeroing them inside the graph would add a memset to
    every replay, a cost the size of the kernel's at short caches (benchmarks/probes/NOTES.md). A
    slice serves only
    its own graph node, and CUDA runs the launches of one graph in order. Captured before any
    eager call, or once the pool is used up, the counters are zeroed in the graph.

    cached=False (torch.compile's custom op): fresh buffers, with counters from the pool only
    while capturing and only if an eager call made it: torch.compile's CUDA graphs warm up in
    their own memory pool and refuse allocations that outlive the call."""
    def make(role, numel):
        if role == "arrivals":
            return torch.zeros(numel, dtype=torch.int32, device=device)
        return torch.empty(numel, dtype=torch.float32, device=device)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if device.type != "cuda" or (not cached and not capturing):
        return {role: make(role, numel) for role, numel in needs.items()}
    if capturing:
        return {role: graph_counters(device, numel) if role == "arrivals" else make(role, numel)
                for role, numel in needs.items()}
    if device.index not in _graph_counters:
        _graph_counters[device.index] = [torch.zeros(GRAPH_COUNTERS, dtype=torch.int32,
                                                     device=device), 0]
        torch.cuda.current_stream(device).synchronize()   # zero before any graph can use it
    stream = triton.runtime.driver.active.get_current_stream(device.index)
    mine = _workspaces.setdefault((device.index, stream), {})
    for role, numel in needs.items():
        if role not in mine or mine[role].numel() < numel:
            mine[role] = make(role, max(numel, 2 * mine[role].numel() if role in mine else 0))
    return mine


def graph_counters(device, numel):
    """``numel`` zeroed arrival counters for a launch being captured, never handed out again."""
    numel = cdiv(numel, 4) * 4      # slices stay 16-byte aligned, as Triton assumed
    with _graph_counters_lock:
        pool = _graph_counters.get(device.index)
        if pool is not None and pool[1] + numel <= pool[0].numel():
            pool[1] += numel
            return pool[0][pool[1] - numel:pool[1]]
    return torch.zeros(numel, dtype=torch.int32, device=device)       # a memset in the graph


def decode_partial(q, k_cache, v_cache, cache_seqlens=None, *, num_splits=None, scale=None,
                   config=None, score_mod=None, block_table=None, options=None):
    """Launch the split-KV kernel. Returns ``(o_part, lse_part)``, one result per split.

    q: (B, Hq, Nq, D); k_cache, v_cache: (B, Hkv, Lmax, D); cache_seqlens: (B,) ints, valid keys
    per sequence (None: all Lmax). o_part: (B, Hq, Nq, S, D) float32, each split's output
    normalised over its own keys; lse_part: (B, Hq, Nq, S) float32, natural log, -inf for a split
    with no key to attend to (its o_part is 0). config: (BLOCK_N, num_warps, num_stages) to use
    instead of ``block_n_for``'s (for tuning); score_mod: a ``kernels.score_mod.ScoreMod`` or None;
    block_table: int32 (B, max_pages), the caches being pages (num_pages, Hkv, page_size, D).
    options: a ``runtime.KernelOptions`` (None: those in force). Inputs are validated by
    ``flashlib.decode``.
    """
    return _launch(q, k_cache, v_cache, cache_seqlens, num_splits, scale, config,
                   score_mod=score_mod, block_table=block_table, options=options)


def combine(o_part, lse_part, *, out_dtype=None, block_r=16):
    """Launch the merge kernel: ``(o_part, lse_part)`` of ``decode_partial`` -> ``(out, lse)``.

    out: (B, Hq, Nq, D) in ``out_dtype`` (default o_part's); lse: (B, Hq, Nq) float32, natural
    log. Rows whose every split is empty get out 0 and lse -inf. block_r: query rows per program;
    with the one-launch path's rows per program (``launch_plan``'s BLOCK_M, 16 for up to 16 rows
    per group) the merge sums in the same order, so the results are equal bit for bit.
    """
    runtime.check_kernel(_combine_kernel)
    *lead, S, D = o_part.shape
    out = torch.empty((*lead, D), dtype=o_part.dtype if out_dtype is None else out_dtype,
                      device=o_part.device)
    lse = torch.empty(lead, dtype=torch.float32, device=o_part.device)
    rows = lse.numel()
    if rows == 0:
        return out, lse
    block_d = padded_headdim(D)
    launch.run(  # _combine_kernel[grid](...), through flashlib's one launch point
        _combine_kernel, (cdiv(rows, block_r),), o_part.contiguous(), lse_part.contiguous(), out, lse, rows, S, D,
        BLOCK_R=block_r, BLOCK_D=block_d, BLOCK_S=merge_tile(S, block_r, block_d), num_warps=4)
    return out, lse


def flash_decode_forward(q, k_cache, v_cache, cache_seqlens=None, *, num_splits=None, scale=None,
                         config=None, return_lse=True, cached_scratch=True, score_mod=None,
                         block_table=None, options=None, longest=None, ragged=None, append=None):
    """Flash-Decoding in one launch: the split-KV kernel, whose last split per row block merges
    (``decode_partial`` then ``combine``, fused). Returns ``(out, lse)``, out like q; lse is None
    unless ``return_lse`` (then it goes to the stream's scratch instead of a new tensor).
    cached_scratch=False: no scratch outlives the call (``workspace``'s ``cached``). options: a
    ``runtime.KernelOptions`` (None: those in force). longest, ragged: what the caller knows of
    ``cache_seqlens`` on the host (``launch_plan``); None: the worst case. append: as ``_launch``'s.

    One launch instead of two matters at short caches, where the host's time per Triton launch
    (tens of microseconds) exceeds the GPU's work (benchmarks/probes/NOTES.md)."""
    B, Hq, Nq, D = q.shape
    out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device) if return_lse else None
    _launch(q, k_cache, v_cache, cache_seqlens, num_splits, scale, config, merge_into=(out, lse),
            cached_scratch=cached_scratch, score_mod=score_mod, block_table=block_table, options=options,
            longest=longest, ragged=ragged, append=append)
    return out, lse
