"""Flash-Decoding in Triton: split-KV attention of a few new query tokens over a long KV cache.

Follows Dao, Haziza, Massa and Sizov, "Flash-Decoding for long-context inference" (2023), on top
of FlashAttention-2's inner loop (Dao 2023, Algorithm 1):
- with one new token per sequence, FA2's grid (query blocks x batch x heads) has only B * H
  programs, too few to fill a GPU; Flash-Decoding also splits the keys: each sequence's cache is
  cut into ``num_splits`` chunks of whole key blocks, and one program per (batch x KV head, row
  block, split) runs FA2's loop (``kernels.tile.tile_update``) over its chunk;
- each program writes its normalised partial output and its lse (natural log, float32); a second
  kernel merges the splits of every query row by their lse, lesson 03's merge:
  lse = logsumexp_s(lse_s), out = sum_s exp(lse_s - lse) * out_s. An empty split (past its
  sequence's length) has out 0 and lse -inf, so its weight is exactly 0; a row with nothing to
  attend to gets out 0 and lse -inf, never NaN;
- grouped-query heads: the GROUP query heads that share a K/V head, times the new tokens, are the
  rows of one tile (row r = g * Nq + i), so each K/V block is read once per group, not once per
  query head;
- ragged batches: sequence b has ``cache_seqlens[b]`` valid keys, split evenly over the programs
  of that sequence; the new tokens are the last Nq positions, bottom-right causal among them (new
  token i sees key j iff j <= i + L - Nq).

Layout (batch, heads, seqlen, headdim) with any strides (a last dim that is not contiguous is
copied). Head dims up to 256, padded inside to a power of two (>= 16) and masked; float16,
bfloat16 and float32 (exact ``ieee`` dots). One block config (``CONFIGS``) and a split heuristic
(``num_splits_heuristic``), both from timings on an H100 (benchmarks/results/h100/decode_sweep.log).
Limits: lengths are clamped to [0, Lmax] inside the kernel (``flashlib.decode.flash_decode``
checks them on the host only for CPU tensors, to keep a device sync out of every decoding step);
within one sequence and head, key offsets (position x row stride) must fit in int32.
"""
import functools
import math

import torch
import triton
import triton.language as tl

from .. import runtime
from .config import _smem_limit
from .fa2_fwd import _attend_key_blocks
from .tile import LOG2E, finalize, tile_update

# (BLOCK_N, num_warps, num_stages) for the partial kernel, best first (timed on an H100 at d=128,
# float16: python -m flashlib.bench_decode --sweep): the first whose K/V pipeline fits in shared
# memory is used. Through the interpreter, 32-key blocks: small caches still have blocks to split.
CONFIGS = [(64, 4, 3), (32, 4, 3), (64, 8, 3), (64, 4, 2), (32, 4, 2), (16, 4, 1)]
INTERPRETER_BLOCK_N = 32
MAX_ROWS = 64            # query rows per program (group x new tokens); more rows: more row blocks
MAX_SPLITS = 128         # the heuristic's cap; an explicit num_splits may be anything >= 1
MIN_BLOCKS_PER_SPLIT = 4  # the heuristic gives each split at least this many key blocks
NOMINAL_SMS = 132        # SM count assumed through the interpreter (an H100's), for the counts


@triton.jit
def _decode_partial_kernel(Q, K, V, Seqlens, OPart, LsePart,
                           stride_qb, stride_qh, stride_qm,
                           stride_kb, stride_kh, stride_kn,
                           stride_vb, stride_vh, stride_vn,
                           Hkv, Nq, Lmax, D, qk_scale, num_splits, n_row_blocks, GROUP,
                           HAS_SEQLENS: tl.constexpr, CAUSAL: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
                           DOT_PRECISION: tl.constexpr, TILE_UPDATE: tl.constexpr):
    # 1-D grid (CUDA caps grid axes 1 and 2 at 65535): (batch x kv head, row block, split),
    # split fastest
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
    offs_n = tl.arange(0, BLOCK_N)                           # (BN,)
    offs_d = tl.arange(0, BLOCK_D)                           # (BD,)

    q_ptrs = (Q + off_b.to(tl.int64) * stride_qb
              + (off_hkv * GROUP + offs_g).to(tl.int64)[:, None] * stride_qh
              + offs_i[:, None] * stride_qm + offs_d[None, :])   # (BM, BD)
    q = tl.load(q_ptrs, mask=(offs_r[:, None] < rows) & (offs_d[None, :] < D), other=0.0)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh

    # this split's keys: [lo, hi) of the L valid ones, chunks of whole key blocks
    L = Lmax
    if HAS_SEQLENS:
        L = tl.minimum(tl.maximum(tl.load(Seqlens + off_b).to(tl.int32), 0), Lmax)
    chunk = tl.cdiv(tl.cdiv(L, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, L)                            # hi <= lo: an empty split
    # keys every row may see (bottom-right causal: token i sees j <= i + L - Nq) run unmasked
    seen_by_all = tl.minimum(hi, L - Nq + 1) if CAUSAL else hi
    n_full = lo + tl.maximum(seen_by_all - lo, 0) // BLOCK_N * BLOCK_N

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attend_key_blocks(
        acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, lo, n_full, L,
        L - Nq, qk_scale, offs_i, offs_n, offs_d, D,
        False, CAUSAL, EVEN_D, BLOCK_N, DOT_PRECISION, TILE_UPDATE)
    acc, m_i, l_i = _attend_key_blocks(
        acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, n_full, hi, L,
        L - Nq, qk_scale, offs_i, offs_n, offs_d, D,
        True, CAUSAL, EVEN_D, BLOCK_N, DOT_PRECISION, TILE_UPDATE)
    out, lse = finalize(acc, m_i, l_i)                        # empty split: 0 and -inf

    # partials are (B, Hq, Nq, S, D) and (B, Hq, Nq, S): a group's rows are contiguous
    row = off_bh.to(tl.int64) * rows + offs_r                 # (BM,) global query row
    o_ptrs = OPart + (row[:, None] * num_splits + split) * D + offs_d[None, :]
    tl.store(o_ptrs, out, mask=(offs_r[:, None] < rows) & (offs_d[None, :] < D))
    tl.store(LsePart + row * num_splits + split, lse, mask=offs_r < rows)


@triton.jit
def _combine_kernel(OPart, LsePart, Out, Lse, num_splits, D,
                    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge one query row's splits by their lse, BLOCK_S splits at a time (lesson 03's merge)."""
    row = tl.program_id(0).to(tl.int64)                      # one (batch, head, new token)
    offs_s = tl.arange(0, BLOCK_S)                           # (BS,)
    offs_d = tl.arange(0, BLOCK_D)                           # (BD,)
    m = tl.full([], float("-inf"), dtype=tl.float32)         # running max of the lse_s
    total = tl.full([], 0.0, dtype=tl.float32)               # running sum of exp(lse_s - m)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)              # running sum of exp(lse_s - m) out_s
    for s0 in range(0, num_splits, BLOCK_S):
        splits = s0 + offs_s
        lse_s = tl.load(LsePart + row * num_splits + splits, mask=splits < num_splits,
                        other=float("-inf"))                 # (BS,)
        o_s = tl.load(OPart + (row * num_splits + splits[:, None]) * D + offs_d[None, :],
                      mask=(splits[:, None] < num_splits) & (offs_d[None, :] < D), other=0.0)
        m_new = tl.maximum(m, tl.max(lse_s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # all empty so far: no NaN
        alpha = tl.exp(m - m_safe)
        w = tl.exp(lse_s - m_safe)                           # (BS,) 0 for empty splits
        total = total * alpha + tl.sum(w, 0)
        acc = acc * alpha + tl.sum(w[:, None] * o_s, 0)
        m = m_new
    empty = total == 0.0
    out = acc / tl.where(empty, 1.0, total)
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, total)))
    tl.store(Out + row * D + offs_d, out.to(Out.dtype.element_ty), mask=offs_d < D)
    tl.store(Lse + row, lse)


@functools.lru_cache(maxsize=None)
def block_n_for(block_d, elem_bytes):
    """The partial kernel's (BLOCK_N, num_warps, num_stages): the first config that fits SRAM."""
    if runtime.INTERPRET:
        return INTERPRETER_BLOCK_N, 4, 1
    fits = [c for c in CONFIGS if elem_bytes * block_d * (16 + 2 * c[0] * c[2]) <= _smem_limit()]
    return (fits or CONFIGS[-1:])[0]


@functools.lru_cache(maxsize=None)
def sm_count(device) -> int:
    """Multiprocessors of ``device``'s GPU; ``NOMINAL_SMS`` through the interpreter."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return NOMINAL_SMS


def num_splits_heuristic(batch, heads_kv, row_blocks, max_len, *, block_n, sms, ragged=False):
    """Splits per sequence. Equal lengths: as many as fit one program per SM (one wave, each
    program streaming one long chunk through its software pipeline; measured best on an H100).
    Lengths given (``ragged``): 8x that, so that the long sequences' chunks spread over the SMs
    the short ones leave idle. At least 1, at most ``MAX_SPLITS``, no split shorter than
    ``MIN_BLOCKS_PER_SPLIT`` key blocks."""
    programs = max(1, batch * heads_kv * row_blocks)
    longest = triton.cdiv(max_len, block_n * MIN_BLOCKS_PER_SPLIT)
    return max(1, min(sms // programs * (8 if ragged else 1), longest, MAX_SPLITS))


def launch_plan(q, k_cache, cache_seqlens=None, *, num_splits=None, config=None):
    """What ``decode_partial`` launches: (BLOCK_M, row blocks, (BLOCK_N, num_warps, num_stages),
    num_splits), from the shapes (and ``num_splits_heuristic`` unless num_splits is given)."""
    B, Hq, Nq, D = q.shape
    Hkv, Lmax = k_cache.shape[1], k_cache.shape[2]
    rows = Hq // Hkv * Nq
    block_m = max(16, min(MAX_ROWS, triton.next_power_of_2(rows)))
    row_blocks = triton.cdiv(rows, block_m)
    if config is None:
        config = block_n_for(max(16, triton.next_power_of_2(D)), q.element_size())
    if num_splits is None:
        num_splits = num_splits_heuristic(B, Hkv, row_blocks, Lmax, block_n=config[0],
                                          sms=sm_count(q.device), ragged=cache_seqlens is not None)
    return block_m, row_blocks, config, num_splits


def _prepare(q, k_cache, v_cache):
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    if runtime.INTERPRET and q.dtype == torch.bfloat16:
        # the interpreter computes bfloat16 dots wrongly: run the same kernel in float32 on CPU
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    return q, k_cache, v_cache


def decode_partial(q, k_cache, v_cache, cache_seqlens=None, *, num_splits=None, scale=None,
                   config=None):
    """Launch the split-KV kernel. Returns ``(o_part, lse_part)``, one result per split.

    q: (B, Hq, Nq, D); k_cache, v_cache: (B, Hkv, Lmax, D); cache_seqlens: (B,) ints, valid keys
    per sequence (None: all Lmax). o_part: (B, Hq, Nq, S, D) float32, each split's output
    normalised over its own keys; lse_part: (B, Hq, Nq, S) float32, natural log, -inf for a split
    with no key to attend to (its o_part is 0). config: (BLOCK_N, num_warps, num_stages) to use
    instead of ``block_n_for``'s (for tuning). Inputs are validated by ``flashlib.decode``.
    """
    runtime.check_kernel(_decode_partial_kernel)
    q, k_cache, v_cache = _prepare(q, k_cache, v_cache)
    B, Hq, Nq, D = q.shape
    Hkv, Lmax = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    block_d = max(16, triton.next_power_of_2(D))
    block_m, row_blocks, (block_n, warps, stages), num_splits = launch_plan(
        q, k_cache, cache_seqlens, num_splits=num_splits, config=config)
    o_part = torch.empty((B, Hq, Nq, num_splits, D), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((B, Hq, Nq, num_splits), dtype=torch.float32, device=q.device)
    grid = (B * Hkv * row_blocks * num_splits,)
    if grid[0] == 0:
        return o_part, lse_part
    _decode_partial_kernel[grid](
        q, k_cache, v_cache, q if cache_seqlens is None else cache_seqlens, o_part, lse_part,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        Hkv, Nq, Lmax, D, scale * LOG2E, num_splits, row_blocks, Hq // Hkv,
        HAS_SEQLENS=cache_seqlens is not None, CAUSAL=Nq > 1, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=block_d, EVEN_D=(D == block_d),
        DOT_PRECISION="ieee", TILE_UPDATE=tile_update, num_warps=warps, num_stages=stages)
    return o_part, lse_part


def combine(o_part, lse_part, *, out_dtype=None):
    """Launch the merge kernel: ``(o_part, lse_part)`` of ``decode_partial`` -> ``(out, lse)``.

    out: (B, Hq, Nq, D) in ``out_dtype`` (default o_part's); lse: (B, Hq, Nq) float32, natural
    log. Rows whose every split is empty get out 0 and lse -inf.
    """
    runtime.check_kernel(_combine_kernel)
    *lead, S, D = o_part.shape
    out = torch.empty((*lead, D), dtype=o_part.dtype if out_dtype is None else out_dtype,
                      device=o_part.device)
    lse = torch.empty(lead, dtype=torch.float32, device=o_part.device)
    rows = out.numel() // max(D, 1)
    if rows == 0:
        return out, lse
    _combine_kernel[(rows,)](o_part.contiguous(), lse_part.contiguous(), out, lse, S, D,
                             BLOCK_S=min(64, triton.next_power_of_2(S)),
                             BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=4)
    return out, lse


def flash_decode_forward(q, k_cache, v_cache, cache_seqlens=None, *, num_splits=None, scale=None,
                         config=None):
    """Both kernels: ``decode_partial`` then ``combine``. Returns ``(out, lse)``, out like q."""
    o_part, lse_part = decode_partial(q, k_cache, v_cache, cache_seqlens, num_splits=num_splits,
                                      scale=scale, config=config)
    return combine(o_part, lse_part, out_dtype=q.dtype)
