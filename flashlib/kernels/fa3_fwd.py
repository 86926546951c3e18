"""FlashAttention-3 forward for Hopper (sm90) in Gluon: TMA, warp specialisation, async wgmma.

Follows Shah et al., "FlashAttention-3" (2024), sections 3.1 and 3.2, with flashlib's FA2
contract (``fa2_fwd.fa2_forward``: same inputs and outputs, bottom-right causal, grouped heads):

- 3.1 producer-consumer asynchrony: a *producer* partition (one warp) issues TMA loads of Q and
  of the K/V blocks into a ring of STAGES shared-memory stages; *consumer* warpgroups (4 warps
  each, 64 query rows each, 1 or 2 per CTA) run the matmuls and the softmax. A stage has a
  ``ready`` mbarrier per tensor (K, V: completed by the TMA engine once the expected bytes have
  landed) and an ``empty`` one (each consumer arrives once its wgmma has read the stage: NUM_WG
  arrivals). K and V are separate so that S = Q K^T can start before V has landed.
  Ping-pong (PINGPONG): the consumers take turns to issue their matmuls, so that one's softmax
  (exp2 on the multi-function units) runs while another's wgmmas keep the tensor cores busy.
  FA3 passes the turn with named barriers; Gluon offers mbarriers: ``turn[w]``, one per consumer.
- 3.2 intra-warpgroup overlap (OVERLAP): a consumer issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}
  back to back, waits for S_j only, and runs its softmax while the PV wgmma is still in flight.

Scores are in base 2 (``qk_scale = scale * log2(e)``, ``exp2``), normalisation is deferred and
lse is written in natural log, as in FA2. The consumers' softmax is bound by instructions issued
(benchmarks/probes/NOTES.md, nineteenth session), so a positive factor of the scores (the scale
of plain scores, a softcap's cap) is not multiplied in per score: the max is taken before it and
it joins exp2's subtraction, one FFMA (``_fold``, ``_softmax_step``). The scores pass through the
portable kernels' score-modifier hook (``kernels.score_mod``: softcap, ALiBi; SCORE_MOD, the same
``@triton.jit`` functions, which Gluon compiles with the scores' wgmma layout) before the mask. Q, K, V and O move through 4-D tensor descriptors
(batch, head, row, dim): TMA zero-fills rows past a head's Nq or Nk and drops stores past Nq, so
a ragged tail never reads or writes the next head; keys past Nk still score 0 and are masked to
-inf. Only key blocks that cross Nk or the causal diagonal pay for the mask. O leaves through the
Q buffer (Q is no longer needed) and one TMA store; lse through a masked store.

Packed sequences (VARLEN, ``flash_attention_varlen``'s layout: q (total_q, Hq, D) with int32
offsets ``cu_seqlens``) go through the same descriptors over (1, H, total, D) views, each
sequence's rows addressed from its offset. TMA then clips only at the packed tensor's end, so a
block that runs past its sequence reads the next one's rows: keys past Nk are masked as ragged
ones, query rows past Nq are computed and not stored, and a sequence's last query block leaves by
a masked store from registers instead of TMA. The grid numbers the pack's query blocks
(``_packed_block``), not max_seqlen's blocks of every sequence::

    cu_seqlens_q = [0, 300, 310, 700], CTA of 128 rows: blocks [0, 1, 2 | 3 | 4, 5, 6, 7]
    sequence 0 rows 0..299 -> blocks 0-2 (block 2: rows 256..299, masked store), sequence 1 -> 3

One CTA, 2 consumers with OVERLAP and PINGPONG (j: key block, s = j % STAGES)::

    producer   | TMA Q0,Q1 | wait empty[s], expect ready[s], TMA K_j | ... V_j | K_j+1 ...
    consumer 0 | S_0 sm_0 |[turn: S_1, PV_0]| softmax S_1 | wait PV_0, O*=a |[turn: S_2, PV_1]|
    consumer 1 | S_0 sm_0 | (waits turn)    |[turn: S_1, PV_0]| softmax S_1 | wait PV_0 | ...
               consumer 0's softmax runs under consumer 1's wgmmas, and the other way round

    q_bar[w]         TMA -> consumer w                         (count 1 + Q's bytes)
    k_ready/v_ready  TMA -> consumers                          (count 1 + the block's bytes)
    k_empty/v_empty  consumers -> producer                     (count NUM_WG)
    turn[w]          consumer w-1 -> consumer w (mod NUM_WG)   (count 1)

Phases: a stage's barriers complete once per trip round the ring, so the j-th block waits for
parity (j // STAGES) & 1 and the producer waits on ``empty`` with the opposite parity, which a
fresh barrier already satisfies (its "previous" phase counts as complete): the first STAGES
loads go ahead. Consumer 0's first turn passes the same way; consumer w > 0 waits for parity
k & 1 of its k-th turn. Every partition runs the same number of key blocks (counted for the
CTA's whole query block), so every arrival has its wait and no barrier gets two phases ahead.

``VARIANTS`` names the combinations (``simple``: producer + one consumer, no overlap); the
launcher runs ``DEFAULT_VARIANT`` unless told otherwise; ``benchmarks/probes/hopper_probe.py`` checks
and times them all, ``benchmarks/probes/hopper_compile_check.py`` compiles them without a GPU.
Gluon's API changes between Triton releases; this file is written for Triton 3.6's
``triton.experimental.gluon``. Importing it never fails: on another Triton, or without Gluon's
Hopper module, the kernels are not defined and ``supported`` is False (callers use FA2).
"""
import functools
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .. import runtime
from ..inputs import resolve_scale
from . import launch
from .config import cdiv, padded_headdim
from .launch import Descriptor, fast_launch, plan_key, remember
from .score_mod import (alibi_bias, alibi_slope, identity, softcap_cap, softcap_tanh, tanh_softcap,
                        tanh_softcap_approx)
from .score_mod import kernel_args as score_mod_args
from .tile import LOG2E

TESTED_TRITON = ("3.6.",)   # Gluon's API as this file uses it; other releases fall back to FA2

try:   # Gluon's Hopper API; absent or different elsewhere: fall back to FA2
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    _GLUON = triton.__version__.startswith(TESTED_TRITON)
except Exception:   # noqa: BLE001  (ImportError, or a renamed symbol in another release)
    _GLUON = False

HEAD_DIMS = (64, 128)
BLOCK_M = 64    # query rows per consumer warpgroup: 4 warps x 16 rows, wgmma's M per warpgroup
SMEM_BYTES = 232448     # H100/H200 shared memory per block (227 KiB)
SMEM_SPARE = 8192       # kept for the barriers and the compiler's own scratch
MAX_STAGES = 4


class Variant(NamedTuple):
    """One way to run the kernel. num_wg: consumer warpgroups (CTA block of num_wg * 64 query
    rows); block_n: keys per K/V block; overlap: FA3 section 3.2's intra-warpgroup pipelining;
    pingpong: consumers take turns at the tensor cores (section 3.1); regs: registers per consumer
    thread (setmaxnreg) when there are several; head_dims: where it compiles without spills."""
    num_wg: int
    block_n: int
    overlap: bool
    pingpong: bool
    regs: int
    head_dims: tuple
    about: str


VARIANTS = {
    "simple": Variant(1, 128, False, False, 0, (64, 128), "producer + 1 consumer warpgroup"),
    "2wg": Variant(2, 128, False, False, 240, (64, 128), "2 consumer warpgroups (128 rows)"),
    "2wg_overlap": Variant(2, 128, True, False, 240, (64, 128), "2 consumers + intra-WG overlap"),
    "2wg_pingpong": Variant(2, 128, True, True, 240, (64, 128), "2 consumers + overlap + ping-pong"),
    # three consumers (192 rows, 160 registers each, 64-key blocks to fit) were slower than
    # 2wg_pingpong at d64 (benchmarks/probes/NOTES.md): removed
}
DEFAULT_VARIANT = {64: "2wg_pingpong", 128: "2wg_pingpong"}   # ahead in benchmarks/probes/hopper_probe.py
# FP8, the fastest variant per (head dim, causal) in same-process rounds (benchmarks/probes/fp8_probe.py;
# numbers in NOTES.md): one consumer at d64 (78 KB of shared memory and 128 registers a thread
# leave room for two CTAs an SM), but it does not finish causal where two CTAs of unequal work
# share an SM (benchmarks/probes/fp8_hang_repro.py; cause not found): refused under a causal mask,
# where ping-pong leads; at d128 overlap, and ping-pong causal.
DEFAULT_VARIANT_FP8 = {(64, False): "simple", (64, True): "2wg_pingpong", (128, False): "2wg_overlap",
                       (128, True): "2wg_pingpong"}


def kernel_config(variant: str, D: int, fp8: bool = False, smem_bytes: Optional[int] = None,
                  key_order: bool = True) -> dict:
    """The kernel's constexprs for ``variant`` at head dim D: the K/V ring as deep as fits beside
    the Q blocks (Q: num_wg x 64 x D, each stage one K and one V block of block_n x D) in
    ``smem_bytes`` (None: ``SMEM_BYTES``). In FP8 (1-byte Q, K, V) the bf16 output needs its own
    buffer: num_wg x 64 x D x 2 bytes; key_order: FP8's V^T holds its keys in the order of P's
    registers (``_p_operand``, ``fp8_key_at``)."""
    v = VARIANTS[variant]
    if D not in v.head_dims:
        raise ValueError(f"variant {variant!r} is for head dims {v.head_dims}, not {D}")
    elem_bytes = 1 if fp8 else 2
    q_bytes = v.num_wg * BLOCK_M * D * (elem_bytes + (2 if fp8 else 0))
    smem_bytes = SMEM_BYTES if smem_bytes is None else smem_bytes
    stages = min(MAX_STAGES, (smem_bytes - SMEM_SPARE - q_bytes) // (2 * v.block_n * D * elem_bytes))
    return dict(BLOCK_M=BLOCK_M, BLOCK_N=v.block_n, HEAD_D=D, NUM_WG=v.num_wg, STAGES=stages,
                OVERLAP=v.overlap, PINGPONG=v.pingpong and v.num_wg > 1,
                CONSUMER_REGS=v.regs or 240, FP8=fp8, KEY_ORDER=fp8 and key_order)


def launch_options(variant: str) -> dict:
    """Triton's launch options for ``variant``: 4 warps (the default partition is consumer 0) and,
    with one consumer, a launch register count (8 warps x 128; setmaxnreg then moves the
    producer's share to the consumer: 232 and 24). With more consumers Triton's own choice
    (64K registers over all warps) is what the setmaxnreg plan is computed from."""
    return dict(num_warps=4, **({"maxnreg": 128} if VARIANTS[variant].num_wg == 1 else {}))


if _GLUON:
    @gluon.jit
    def load_kv_ring(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, batch, kv_head,
                     first_row, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, V_T: gl.constexpr = False):
        """The producer's loop (exercise 12c writes it): K_j and V_j, j < n_blocks, by TMA into
        stage j % STAGES of the ring, rows first_row + j * BLOCK_N of (batch, kv_head). V_T (FP8):
        V's blocks are (D, BLOCK_N) tiles of V^T, at column j * BLOCK_N."""
        for j in range(n_blocks):
            s = j % STAGES
            phase = (j // STAGES) & 1
            # K and V have their own barriers: S = Q K^T can start before V has landed
            mbarrier.wait(k_empty.index(s), phase ^ 1)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [batch, kv_head, first_row + j * BLOCK_N, 0],
                                            k_ready.index(s), k_smem.index(s))
            mbarrier.wait(v_empty.index(s), phase ^ 1)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            if V_T:
                tma.async_copy_global_to_shared(v_desc, [batch, kv_head, 0, j * BLOCK_N],
                                                v_ready.index(s), v_smem.index(s))
            else:
                tma.async_copy_global_to_shared(v_desc, [batch, kv_head, first_row + j * BLOCK_N, 0],
                                                v_ready.index(s), v_smem.index(s))

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, k_empty, v_ready,
                  v_empty, tma_b, off_h, off_hkv, start_m, n_blocks, q_row0, k_row0,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr,
                  STAGES: gl.constexpr, FP8: gl.constexpr, KV_LOADER: gl.constexpr):
        """One warp: TMA loads of each consumer's Q rows, then K and V block by block into the ring
        (``KV_LOADER``: ``load_kv_ring`` or a learner's; in FP8 always ``load_kv_ring`` with V^T's
        blocks). tma_b, q_row0, k_row0: the descriptors' batch coordinate and the sequence's first
        rows (VARLEN; else 0)."""
        for w in gl.static_range(NUM_WG):
            mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [tma_b, off_h, q_row0 + start_m + w * BLOCK_M, 0],
                                            q_bars.index(w), q_smem.index(w))
        if FP8:
            load_kv_ring(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, tma_b, off_hkv,
                         k_row0, n_blocks, BLOCK_N, STAGES, True)
        else:
            KV_LOADER(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, tma_b, off_hkv,
                      k_row0, n_blocks, BLOCK_N, STAGES)

    @gluon.jit
    def _mask_scores(s, j, n_full, row0, Nq, Nk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     CAUSAL: gl.constexpr, s_layout: gl.constexpr):
        """-inf where key j*BN+c is past Nk or (causal) after query row0+r's diagonal; blocks before
        ``n_full`` are inside both for every row and skip the compares (a uniform branch)."""
        if j >= n_full:
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            visible = gl.expand_dims(cols < Nk, 0)                                     # (1, BN)
            if CAUSAL:
                q_pos = row0 + Nk - Nq + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
                visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(q_pos, 1))  # (BM, BN)
            s = gl.where(visible, s, float("-inf"))
        return s

    @gluon.jit
    def _scores(s, qk_scale, j, n_full, row0, Nq, Nk, bh, mod_args, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, SCORE_MOD: gl.constexpr,
                ALIBI_SPLIT: gl.constexpr, FOLD: gl.constexpr, s_layout: gl.constexpr):
        """Key block j's scores s (BM, BN), scaled by qk_scale, through the score-modifier hook
        (``kernels.score_mod``, the same @triton.jit functions as the portable kernels', compiled
        here with Gluon's layouts), then the mask. The identity's positions are never used and
        compile away. Returns the scores, r (BM,) and c: the block's scores are s c + r per row,
        c a factor ``_softmax_step`` multiplies in (FOLD; else 1).

        ALIBI_SPLIT (ALiBi alone): where every key of the block is at or before every query's
        position (or at or after), -slope |q - k| is +-slope (k - n0) + +-slope (n0 - q), a
        column term added here (one FFMA with the scale's multiply) and a row term r, which
        ``_softmax_step`` adds to the row's max: no per-score work beyond the plain kernel's. The
        blocks across the diagonal take the hook. r is 0 otherwise.

        FOLD 1 (plain scores, qk_scale > 0): s is returned unscaled, c = qk_scale. FOLD 2 and 3 (a
        softcap alone, tanh by ``score_mod.softcap_tanh``'s formula or tanh.approx): tanh(s / c)
        is returned, c = the cap. ``_softmax_step`` multiplies c in (see there)."""
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        r = gl.zeros([BLOCK_M], gl.float32, row_layout)
        if FOLD == 1:
            return _mask_scores(s, j, n_full, row0, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL, s_layout), r, qk_scale
        s = s * qk_scale
        if FOLD >= 2:
            t = softcap_tanh(s, FOLD == 3)
            return (_mask_scores(t, j, n_full, row0, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL, s_layout), r,
                    softcap_cap(bh, mod_args))
        n0 = j * BLOCK_N
        first_q = row0 + Nk - Nq                       # the block's first query on the key axis
        before = n0 + BLOCK_N - 1 <= first_q           # every key at or before every query
        if ALIBI_SPLIT and (before or n0 >= first_q + BLOCK_M - 1):
            sign_slope = alibi_slope(bh, mod_args) * (before.to(gl.float32) * 2.0 - 1.0)
            keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)).to(gl.float32)
            s = s + gl.expand_dims(keys * sign_slope, 0)                                 # (k - n0)
            r = (n0 - first_q - gl.arange(0, BLOCK_M, layout=row_layout)).to(gl.float32) * sign_slope
        else:
            cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))   # (BN,)
            q_pos = first_q + gl.arange(0, BLOCK_M, layout=row_layout)
            s, _ = SCORE_MOD(s, gl.expand_dims(q_pos, 1), gl.expand_dims(cols, 0), bh, mod_args)
        return _mask_scores(s, j, n_full, row0, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL, s_layout), r, 1.0

    @gluon.jit
    def _softmax_step(s, r, c, m_i, l_i, ALIBI_SPLIT: gl.constexpr, FOLD: gl.constexpr):
        """Online softmax on one block of masked scores s c + r (BM, BN), base 2 (r (BM,) a row
        term, ALIBI_SPLIT only; c > 0, FOLD only: see ``_scores``). Returns the new max, the new
        sum, alpha (the old state's rescale factor) and P (float32, S's layout).

        FOLD: the scores' max is c max(s) (a row's work, as c > 0) and each score's factor joins
        exp2's subtraction in one FFMA, s c - m: an instruction per score fewer than multiplying
        first, where the softmax warpgroups are bound by instructions issued (benchmarks/probes/
        NOTES.md, nineteenth session)."""
        if FOLD:
            m_new = gl.maximum(m_i, gl.max(s, 1) * c)
        elif ALIBI_SPLIT:
            m_new = gl.maximum(m_i, gl.max(s, 1) + r)
        else:
            m_new = gl.maximum(m_i, gl.max(s, 1))
        # a row that has seen only masked keys keeps m = -inf; exp2(-inf - -inf) would be NaN
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        if ALIBI_SPLIT:
            m_safe = m_safe - r                # exp2(s + r - m) = exp2(s - (m - r)): per row
        if FOLD:
            p = gl.exp2(s * c - gl.expand_dims(m_safe, 1))
        else:
            p = gl.exp2(s - gl.expand_dims(m_safe, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        return m_new, l_i, alpha, p

    @gluon.jit
    def _p_operand(p, p_layout: gl.constexpr, dtype: gl.constexpr, KEY_ORDER: gl.constexpr):
        """P as the PV wgmma's A operand, in registers: for 16-bit types the S accumulator's
        fragments are the operand's (k_width 2, no data moves). 8-bit A fragments hold 4
        consecutive keys (k_width 4), the accumulator's thread keys 2q, 2q+1, 2q+8, 2q+9, ... of
        every 32: as they stand, moving P there takes shuffles between lanes. KEY_ORDER: V^T's
        column n holds key ``fp8_key_at(n)`` (``transpose_rows``), so P's columns are taken in
        that order too, and each thread's accumulator registers already are its fragment."""
        if KEY_ORDER:   # key = 32 g + 16 c1 + 8 c0 + 2 q + b sits at column 32 g + 16 c1 + 4 q + 2 c0 + b
            M: gl.constexpr = p.shape[0]
            N: gl.constexpr = p.shape[1]
            p = p.reshape([M, N // 32, 2, 2, 4, 2]).permute((0, 1, 2, 4, 3, 5)).reshape([M, N])
        return gl.convert_layout(p.to(dtype), p_layout)

    @gluon.jit
    def _rescale(acc, alpha, o_layout: gl.constexpr):
        alpha = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))   # same rows, no data moves
        return acc * gl.expand_dims(alpha, 1)

    @gluon.jit
    def _v_operand(v_smem, st, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, FP8: gl.constexpr):
        """Stage st's V block as the PV wgmma's B operand (BLOCK_N, HEAD_D). 8-bit wgmma reads B
        only K-major (the reduction dim, keys, contiguous): FP8 stages hold V^T's (HEAD_D, BLOCK_N)
        tiles, viewed transposed; 16-bit stages hold V's rows as they are."""
        if FP8:
            return v_smem.index(st).reshape([HEAD_D, BLOCK_N]).permute((1, 0))
        else:
            return v_smem.index(st).reshape([BLOCK_N, HEAD_D])

    @gluon.jit
    def _consumer(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, o_smem, q_bars, k_ready,
                  k_empty, v_ready, v_empty, turn_bars, lse_base, tma_b, off_h, off_hkv, start_m, n_blocks,
                  Nq, Nk, q_row0, qk_scale, v_scale, bh, mod_args, o_base, stride_om,
                  WG: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                  NUM_WG: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, FP8: gl.constexpr,
                  SCORE_MOD: gl.constexpr, ALIBI_SPLIT: gl.constexpr, VARLEN: gl.constexpr,
                  FOLD: gl.constexpr, KEY_ORDER: gl.constexpr):
        """One warpgroup: rows [row0, row0 + BLOCK_M) of the CTA's query block against n_blocks
        key blocks; writes out (TMA store from o_smem, clipped at Nq; VARLEN: rows from q_row0, and
        a sequence's last block by a masked store from o_base, the sequence's row 0 of this head,
        rows stride_om apart) and lse (masked store).
        qk_scale holds the softmax scale, log2(e) and (FP8) Q's and K's descales; v_scale V's."""
        dtype: gl.constexpr = q_desc.dtype
        # wgmma layouts: 4 warps along M (16 rows each), N the whole tile, K 16 for 16-bit types
        # and 32 for 8-bit ones; P, the A operand from registers, packs 32 bits per k step
        INSTR_K: gl.constexpr = 32 if FP8 else 16
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, INSTR_K])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_D, INSTR_K])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=4 if FP8 else 2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        row0 = start_m + WG * BLOCK_M
        # blocks [0, n_full) are visible to every row of this warpgroup: no mask
        if CAUSAL:
            n_full = gl.minimum(gl.maximum(row0 + Nk - Nq + 1, 0), Nk) // BLOCK_N
        else:
            n_full = Nk // BLOCK_N

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_layout)
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)

        q_view = q_smem.index(WG)
        q = q_view.reshape([BLOCK_M, HEAD_D])
        mbarrier.wait(q_bars.index(WG), 0)      # always: the Q buffer is reused for O below

        if OVERLAP:
            if n_blocks > 0:
                # prologue: S_0 and its softmax; P_0 waits for V_0 in the loop's first step
                mbarrier.wait(k_ready.index(0), 0)
                k = k_smem.index(0).reshape([BLOCK_N, HEAD_D]).permute((1, 0))
                s = warpgroup_mma(q, k, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                                  use_acc=False, is_async=True)
                s = warpgroup_mma_wait(0, deps=(s, ))
                mbarrier.arrive(k_empty.index(0))
                s, r, c = _scores(s, qk_scale, 0, n_full, row0, Nq, Nk, bh, mod_args, BLOCK_M, BLOCK_N,
                                  CAUSAL, SCORE_MOD, ALIBI_SPLIT, FOLD, s_layout)
                m_i, l_i, alpha, p = _softmax_step(s, r, c, m_i, l_i, ALIBI_SPLIT, FOLD)
                # FP8's P crosses the loop's back edge in float32 and becomes the A operand just
                # before its wgmma: Triton carries an 8-bit tensor as single bytes, which ptxas
                # took apart and put back with 3 PRMT per packed register (sm90 SASS)
                if not FP8:
                    p = _p_operand(p, p_layout, dtype, KEY_ORDER)
                for j in range(1, n_blocks):
                    st = j % STAGES
                    prev = (j - 1) % STAGES
                    if PINGPONG:   # my turn to use the tensor cores (consumer 0 goes first:
                        # its first wait passes on the fresh barrier's parity 1, see the docstring)
                        mbarrier.wait(turn_bars.index(WG), ((j - 1) & 1) ^ (1 if WG == 0 else 0))
                    mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
                    k = k_smem.index(st).reshape([BLOCK_N, HEAD_D]).permute((1, 0))
                    s = warpgroup_mma(q, k, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                                      use_acc=False, is_async=True)
                    if FP8:
                        p = _p_operand(p, p_layout, dtype, KEY_ORDER)
                    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
                    v = _v_operand(v_smem, prev, BLOCK_N, HEAD_D, FP8)
                    acc = warpgroup_mma(p, v, acc, is_async=True)
                    if PINGPONG:   # both issued: pass the turn to the next consumer
                        mbarrier.arrive(turn_bars.index((WG + 1) % NUM_WG))
                    s = warpgroup_mma_wait(1, deps=(s, ))      # S_j done, P_{j-1} V_{j-1} may run on
                    mbarrier.arrive(k_empty.index(st))
                    s, r, c = _scores(s, qk_scale, j, n_full, row0, Nq, Nk, bh, mod_args, BLOCK_M,
                                      BLOCK_N, CAUSAL, SCORE_MOD, ALIBI_SPLIT, FOLD, s_layout)
                    m_i, l_i, alpha, p_next = _softmax_step(s, r, c, m_i, l_i, ALIBI_SPLIT, FOLD)
                    if not FP8:
                        p_next = _p_operand(p_next, p_layout, dtype, KEY_ORDER)
                    # P_{j-1} stays a dependency until its wgmma is done: its registers are read
                    # asynchronously, P_j must not land on them. Triton 3.6 takes no 8-bit
                    # dependencies; there ptxas, which allocates the registers and knows that
                    # wgmma reads them until wait_group, keeps them apart (it warns where it
                    # cannot, serialising instead: hopper_compile_check reports that)
                    if FP8:
                        acc = warpgroup_mma_wait(0, deps=(acc, ))
                    else:
                        acc, p = warpgroup_mma_wait(0, deps=(acc, p))
                    mbarrier.arrive(v_empty.index(prev))
                    acc = _rescale(acc, alpha, o_layout)
                    p = p_next
                last = (n_blocks - 1) % STAGES
                mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // STAGES) & 1)
                v = _v_operand(v_smem, last, BLOCK_N, HEAD_D, FP8)
                if FP8:
                    p = _p_operand(p, p_layout, dtype, KEY_ORDER)
                acc = warpgroup_mma(p, v, acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc, ))
                mbarrier.arrive(v_empty.index(last))
        else:
            for j in range(n_blocks):
                st = j % STAGES
                phase = (j // STAGES) & 1
                mbarrier.wait(k_ready.index(st), phase)
                k = k_smem.index(st).reshape([BLOCK_N, HEAD_D]).permute((1, 0))
                s = warpgroup_mma(q, k, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                                  use_acc=False, is_async=True)
                s = warpgroup_mma_wait(0, deps=(s, ))
                mbarrier.arrive(k_empty.index(st))
                s, r, c = _scores(s, qk_scale, j, n_full, row0, Nq, Nk, bh, mod_args, BLOCK_M, BLOCK_N,
                                  CAUSAL, SCORE_MOD, ALIBI_SPLIT, FOLD, s_layout)
                m_i, l_i, alpha, p = _softmax_step(s, r, c, m_i, l_i, ALIBI_SPLIT, FOLD)
                p = _p_operand(p, p_layout, dtype, KEY_ORDER)
                acc = _rescale(acc, alpha, o_layout)
                mbarrier.wait(v_ready.index(st), phase)
                v = _v_operand(v_smem, st, BLOCK_N, HEAD_D, FP8)
                acc = warpgroup_mma(p, v, acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc, ))
                mbarrier.arrive(v_empty.index(st))

        # finalize as tile.finalize: empty rows (l = 0) give out 0 and lse -inf
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)  # x ln 2
        out_scale = v_scale / l_safe
        out = acc * gl.expand_dims(gl.convert_layout(out_scale, gl.SliceLayout(1, o_layout)), 1)
        rows = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
        gl.store(lse_base + rows, lse, mask=rows < Nq)
        out = out.to(o_desc.dtype)
        if VARLEN:
            if row0 + BLOCK_M > Nq:   # a sequence's last block: rows past Nq are the next one's,
                # and TMA clips only at the packed tensor's end: a masked store from registers
                o_rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
                o_cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
                o_ptrs = o_base + gl.expand_dims(o_rows.to(gl.int64) * stride_om, 1) + gl.expand_dims(o_cols, 0)
                gl.store(o_ptrs, out, mask=gl.expand_dims(o_rows < Nq, 1) & gl.expand_dims(o_cols < HEAD_D, 0))
            else:
                _store_out(out, o_smem.index(WG), o_desc, [tma_b, off_h, q_row0 + row0, 0], BLOCK_M, HEAD_D)
        else:
            _store_out(out, o_smem.index(WG), o_desc, [tma_b, off_h, row0, 0], BLOCK_M, HEAD_D)

    @gluon.jit
    def _store_out(out, o_view, o_desc, coords, BLOCK_M: gl.constexpr, HEAD_D: gl.constexpr):
        """out (BLOCK_M, HEAD_D) through o_view (16-bit: the Q buffer, every wgmma reading Q has
        completed; FP8: a bf16 buffer of its own) and one TMA store, which drops rows past the
        descriptor's bounds."""
        o_view.reshape([BLOCK_M, HEAD_D]).store(out)
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, coords, o_view)
        tma.store_wait(0)

    @gluon.jit
    def _add(a, b):
        return a + b

    @gluon.jit
    def _packed_block(CuSeqQ, CuSeqK, n_seq, t, CTA_M: gl.constexpr, MAX_SEQS: gl.constexpr,
                      CAUSAL: gl.constexpr):
        """Query block t of a pack, its blocks numbered sequence after sequence (causal: each
        sequence's last block first): (sequence b, its first row q0 and length Nq, its keys' k0
        and Nk, the block's first row in it); b = n_seq for t past the last block. A grid of
        max_seqlen's blocks per sequence would launch mostly programs that return at once for a
        pack of short and long sequences, which cost measurable time (benchmarks/probes/
        varlen_grid_probe.py, NOTES.md). One load of each offsets vector,
        as the per-sequence loads were; a scan of the block counts finds b."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        seq = gl.arange(0, MAX_SEQS, layout=layout)
        real = seq < n_seq
        q_starts = gl.load(CuSeqQ + seq, mask=real, other=0)
        q_lengths = gl.load(CuSeqQ + seq + 1, mask=real, other=0) - q_starts
        k_starts = gl.load(CuSeqK + seq, mask=real, other=0)
        k_lengths = gl.load(CuSeqK + seq + 1, mask=real, other=0) - k_starts
        blocks = (q_lengths + CTA_M - 1) // CTA_M
        ends = gl.associative_scan(blocks, 0, _add)     # one past each sequence's last block
        b = gl.sum((ends <= t).to(gl.int32), axis=0)    # ends never decrease: t's sequence
        pick = seq == b
        m = t - gl.sum(gl.where(pick, ends - blocks, 0), axis=0)
        if CAUSAL:
            m = gl.sum(gl.where(pick, blocks, 0), axis=0) - 1 - m
        return (b, gl.sum(gl.where(pick, q_starts, 0), axis=0), gl.sum(gl.where(pick, q_lengths, 0), axis=0),
                gl.sum(gl.where(pick, k_starts, 0), axis=0), gl.sum(gl.where(pick, k_lengths, 0), axis=0),
                m * CTA_M)

    # sizes are not specialised (on being 1 or multiples of 16): one compile per configuration
    @gluon.jit(do_not_specialize=["Hq", "Nq", "Nk", "GROUP", "n_descale", "stride_om", "stride_oh",
                                  "total_q", "n_seq"])
    def _fa3_fwd_kernel(q_desc, k_desc, v_desc, o_desc, Lse, Descale, ModArgs, Out, CuSeqQ, CuSeqK,
                        Hq, Nq, Nk, qk_scale, GROUP, n_descale, stride_om, stride_oh, total_q, n_seq,
                        CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        HEAD_D: gl.constexpr, NUM_WG: gl.constexpr, STAGES: gl.constexpr,
                        OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                        FP8: gl.constexpr, SCORE_MOD: gl.constexpr, ALIBI_SPLIT: gl.constexpr,
                        VARLEN: gl.constexpr, MAX_SEQS: gl.constexpr, FOLD: gl.constexpr,
                        KEY_ORDER: gl.constexpr, KV_LOADER: gl.constexpr):
        # Descale (FP8 only): float32 (3, B, Hkv), Q's, K's and V's factors, n_descale = B * Hkv.
        # ModArgs, SCORE_MOD: the score modifier's per-(batch, query head) row and function;
        # ALIBI_SPLIT: SCORE_MOD is ALiBi alone, its bias split off the diagonal (``_scores``)
        # VARLEN: n_seq packed sequences as fa2_fwd's (descriptors over (1, H, total, D) views;
        # Out, stride_om, stride_oh, total_q: the out and lse rows; MAX_SEQS >= n_seq, a power of 2)
        # one flat grid axis as in fa2_fwd: query blocks of one (batch, head) adjacent (K/V shared
        # in L2); causal: the heaviest (last) query blocks first
        CTA_M: gl.constexpr = BLOCK_M * NUM_WG
        tma_b = 0
        q_row0 = 0
        k_row0 = 0
        o_base = Out
        if VARLEN:   # this head's share of the grid numbers the pack's query blocks (_packed_block)
            n_t = gl.num_programs(0) // Hq
            off_h = gl.program_id(0) // n_t
            off_b, q_row0, Nq, k_row0, Nk, start_m = _packed_block(
                CuSeqQ, CuSeqK, n_seq, gl.program_id(0) % n_t, CTA_M, MAX_SEQS, CAUSAL)
            if off_b >= n_seq:       # past the pack's last query block
                return
            off_bh = off_b * Hq + off_h
            lse_base = Lse + off_h.to(gl.int64) * total_q + q_row0
            o_base = Out + q_row0.to(gl.int64) * stride_om + off_h.to(gl.int64) * stride_oh
        else:
            n_m = gl.cdiv(Nq, CTA_M)
            pid_m = gl.program_id(0) % n_m
            off_bh = gl.program_id(0) // n_m
            if CAUSAL:
                pid_m = n_m - 1 - pid_m
            off_b = off_bh // Hq
            off_h = off_bh % Hq
            start_m = pid_m * CTA_M
            tma_b = off_b
            lse_base = Lse + off_bh.to(gl.int64) * Nq
        off_hkv = off_h // GROUP
        # key blocks of the whole CTA: every partition runs exactly n_blocks steps
        if CAUSAL:
            hi = gl.minimum(Nk, gl.maximum(start_m + CTA_M + Nk - Nq, 0))
        else:
            hi = Nk
        n_blocks = gl.cdiv(hi, BLOCK_N)
        if FP8:   # S = (Q8 K8^T) dq dk, O = (P V8) dv: the descales join the scales
            at = off_b * (Hq // GROUP) + off_hkv
            qk_scale = qk_scale * gl.load(Descale + at) * gl.load(Descale + n_descale + at)
            if FOLD:   # descales are >= 0; a 0 would make the masked scores -inf * 0 = NaN,
                # where 1e-30 leaves every score's exp2 at exactly 1, as 0 does
                qk_scale = gl.maximum(qk_scale, 1e-30)
            v_scale = gl.load(Descale + 2 * n_descale + at)
        else:
            v_scale = 1.0

        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [NUM_WG] + q_desc.block_type.shape, q_desc.layout)
        if FP8:
            o_smem = gl.allocate_shared_memory(o_desc.dtype, [NUM_WG] + o_desc.block_type.shape,
                                               o_desc.layout)
        else:
            o_smem = q_smem
        k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_bars = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
        turn_bars = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for w in gl.static_range(NUM_WG):
            mbarrier.init(q_bars.index(w), count=1)          # completed by the TMA's bytes
            mbarrier.init(turn_bars.index(w), count=1)       # one arrival: the previous consumer
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)         # the producer's expect + TMA bytes
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NUM_WG)    # one arrival per consumer
            mbarrier.init(v_empty.index(i), count=NUM_WG)
        # the inits are generic-proxy writes; the TMA engine (the async proxy) completes these
        # barriers: the fence makes the inits visible to it before the first load is issued
        fence_async_shared()

        # worker partitions take no tensors, only descriptors, shared memory and scalars; the
        # argument tuples are written out in the call so that the constexprs stay constexprs.
        # Registers: the consumers in worker partitions ask for CONSUMER_REGS, the producer for
        # 24 (setmaxnreg); the default partition (consumer 0) gets what is left of the 64K.
        if NUM_WG == 1:
            gl.warp_specialize([
                (_consumer, (q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, o_smem, q_bars,
                             k_ready, k_empty, v_ready, v_empty, turn_bars, lse_base, tma_b, off_h, off_hkv,
                             start_m, n_blocks, Nq, Nk, q_row0, qk_scale, v_scale, off_bh, ModArgs,
                             o_base, stride_om, 0, BLOCK_M, BLOCK_N, HEAD_D, NUM_WG, STAGES, CAUSAL,
                             OVERLAP, False, FP8, SCORE_MOD, ALIBI_SPLIT, VARLEN, FOLD, KEY_ORDER)),
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, k_empty,
                             v_ready, v_empty, tma_b, off_h, off_hkv, start_m, n_blocks, q_row0, k_row0,
                             BLOCK_M, BLOCK_N, NUM_WG, STAGES, FP8, KV_LOADER)),
            ], [1], [24])
        else:
            gl.static_assert(NUM_WG == 2, "1 or 2 consumer warpgroups")
            gl.warp_specialize([
                (_consumer, (q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, o_smem, q_bars,
                             k_ready, k_empty, v_ready, v_empty, turn_bars, lse_base, tma_b, off_h, off_hkv,
                             start_m, n_blocks, Nq, Nk, q_row0, qk_scale, v_scale, off_bh, ModArgs,
                             o_base, stride_om, 0, BLOCK_M, BLOCK_N, HEAD_D, NUM_WG, STAGES, CAUSAL,
                             OVERLAP, PINGPONG, FP8, SCORE_MOD, ALIBI_SPLIT, VARLEN, FOLD, KEY_ORDER)),
                (_consumer, (q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, o_smem, q_bars,
                             k_ready, k_empty, v_ready, v_empty, turn_bars, lse_base, tma_b, off_h, off_hkv,
                             start_m, n_blocks, Nq, Nk, q_row0, qk_scale, v_scale, off_bh, ModArgs,
                             o_base, stride_om, 1, BLOCK_M, BLOCK_N, HEAD_D, NUM_WG, STAGES, CAUSAL,
                             OVERLAP, PINGPONG, FP8, SCORE_MOD, ALIBI_SPLIT, VARLEN, FOLD, KEY_ORDER)),
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, k_empty,
                             v_ready, v_empty, tma_b, off_h, off_hkv, start_m, n_blocks, q_row0, k_row0,
                             BLOCK_M, BLOCK_N, NUM_WG, STAGES, FP8, KV_LOADER)),
            ], [4, 1], [CONSUMER_REGS, 24])


def hopper_inputs(q, k, v, dtypes) -> bool:
    """What every Hopper kernel here needs: Triton 3.6's Gluon, CUDA tensors of one dtype among
    ``dtypes`` on an sm90 device, SDPA's layout with grouped heads, head dim 64 or 128."""
    if not _GLUON or runtime.INTERPRET:
        return False
    ts = (q, k, v)
    if any(not isinstance(t, torch.Tensor) or t.device.type != "cuda" or t.ndim != 4 for t in ts):
        return False
    if q.dtype not in dtypes or any(t.dtype != q.dtype for t in ts):
        return False
    if runtime.capability(q.device)[0] != 9 or q.shape[-1] not in HEAD_DIMS:
        return False
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        return False
    return k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0


def supported(q, k, v, packed=False) -> bool:
    """Whether ``fa3_forward`` can run these inputs: ``hopper_inputs`` in float16/bfloat16, last
    dim contiguous and the other strides and the base addresses 16-byte aligned (what TMA
    descriptors need). Otherwise use ``fa2_forward``. packed: q, k, v are packed sequences,
    (total, heads, D), asked about as their ``packed_view``s."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return False
    key = plan_key((q, k, v), ("supported", packed))   # everything the answer depends on (None: no memo)
    answer = _supported.get(key)
    if answer is None:
        views = (q, k, v)
        if packed:   # (total, heads, D) only
            views = tuple(packed_view(t) for t in views) if all(t.ndim == 3 for t in views) else None
        answer = (views is not None and hopper_inputs(*views, (torch.float16, torch.bfloat16))
                  and all(tma_ok(t) for t in views),)
        remember(_supported, key, answer)
    return answer[0]


_supported = {}   # launch.plan_key -> (supported(q, k, v),): asked at every flash_attention call


def packed_view(t):
    """Packed sequences (total, heads, D) as the kernel's (1, heads, total, D), no copy: the
    descriptors' batch coordinate is 0 and a sequence's rows start at its cu_seqlens offset."""
    return t.unsqueeze(0).transpose(1, 2)


def _strides(t):
    """t's strides for a descriptor: a dim of size 1 takes the dense stride (torch may give it any
    value, and TMA only needs it aligned)."""
    strides = list(t.stride())
    for i in reversed(range(t.ndim - 1)):
        if t.shape[i] == 1:
            strides[i] = strides[i + 1] * t.shape[i + 1]
    return strides


def tma_ok(t) -> bool:
    """TMA's needs: 16-byte aligned base and strides, unit last stride, no broadcast (0) strides."""
    e = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s > 0 and (s * e) % 16 == 0 for s in _strides(t)[:-1]))


@functools.cache
def _smem_layout(dtype, block):
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def descriptor(t, block, shape=None):
    """A 4-D TMA descriptor of t (batch, head, row, dim) moving blocks of ``block``; ``shape``:
    the bounds TMA clips at and zero-fills past, when they are smaller than t's."""
    gdtype = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32,
              torch.float8_e4m3fn: gl.float8e4nv}[t.dtype]
    return TensorDescriptor(t, list(shape or t.shape), _strides(t), list(block),
                            _smem_layout(gdtype, tuple(block)))


def fa3_forward(q, k, v, *, causal=False, scale=None, variant=None, score_mod=None, cu_seqlens=None,
                max_seqlen=None, options=None, kv_loader=None):
    """Launch the FA3 forward kernel. Returns ``(out, lse)`` exactly as ``fa2_forward``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D), float16/bfloat16, D in (64, 128), on an sm90 GPU
    (check ``supported`` first). out: like q; lse: (B, Hq, Nq) float32, natural log, -inf for
    rows with no key to attend to (their out is 0). variant: a key of ``VARIANTS`` (default
    ``DEFAULT_VARIANT[D]``). score_mod: a ``kernels.score_mod.ScoreMod`` (softcap, ALiBi), None:
    the scores as they are. cu_seqlens=(cu_q, cu_k), max_seqlen=(max_q, max_k): packed sequences
    as ``fa2_forward`` takes them, q (total_q, Hq, D), k, v (total_k, Hkv, D); out like q, lse
    (Hq, total_q) (check ``supported(q, k, v, packed=True)``). options: a
    ``runtime.KernelOptions`` (None: those in force; its ``fa3_fold_scale`` and ``fa3_smem_bytes``).
    kv_loader: a ``@gluon.jit`` function with ``load_kv_ring``'s arguments (less V_T) that the
    producer runs instead of it (exercise 12c's grader); None: ``load_kv_ring``.
    """
    options = runtime.OPTIONS if options is None else options
    mod_args, mod_fn, input_scale = score_mod_args(score_mod, None)
    packed = () if cu_seqlens is None else tuple(cu_seqlens)
    pointers = (q, k, v, *packed, *([] if mod_args is None else [mod_args]))
    plannable = all(isinstance(t, torch.Tensor) for t in pointers)
    extra = (causal, scale, variant, mod_fn, input_scale, max_seqlen, kv_loader)
    key = plan_key(pointers, extra, options) if plannable else None
    plan = _plans.get(key)
    if plan is not None:   # a call like an earlier one: allocate and replay its launch (launch.py)
        launch, dense_out, lse_shape, (q_view, k_view, v_view, o_view) = plan
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dense_out else torch.empty_like(q)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
        # a descriptor's base is read for its address only: the packed tensors stand for their views
        launch(Descriptor(q, *q_view), Descriptor(k, *k_view), Descriptor(v, *v_view),
               Descriptor(out, *o_view), lse, lse, lse if mod_args is None else mod_args, out,
               *(packed or (lse, lse)))
        return out, lse
    if not supported(q, k, v, packed=bool(packed)):
        raise ValueError("fa3_forward: unsupported inputs (see fa3_fwd.supported); use fa2_forward")
    out = torch.empty_like(q)
    dense_out = not packed and not tma_ok(out)   # empty_like keeps q's strides; a dense copy works
    if dense_out:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if packed:
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
        q, k, v, out4 = (packed_view(t) for t in (q, k, v, out))
        (max_q, max_k), B = max_seqlen, packed[0].numel() - 1
    else:
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        out4, (B, max_q, max_k) = out, (q.shape[0], q.shape[2], k.shape[2])
    D = q.shape[-1]
    if max_q == 0 or B * q.shape[1] == 0 or q.shape[2] == 0:
        return out, lse
    if max_k == 0 or k.shape[2] == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    variant = variant or DEFAULT_VARIANT[D]
    config = kernel_config(variant, D, smem_bytes=options.fa3_smem_bytes)
    v_desc = descriptor(v, (1, 1, config["BLOCK_N"], D))
    launch, views = _launch(q, k, v_desc, out4, lse, causal, resolve_scale(scale, D), None, variant,
                            config, options, score_mod, packed and (*packed, max_q, max_k), kv_loader)
    remember(_plans, key, (launch, dense_out, lse.shape, views))
    return out, lse


_plans = {}   # launch.plan_key -> (Launch, out made dense?, lse's shape, (shape, strides) of each descriptor)


def _launch(q, k, v_desc, out, lse, causal, scale, descale, variant, config, options, score_mod=None,
            varlen=(), kv_loader=None):
    """Launch the kernel; returns its ``Launch`` (None on Triton's plain path) and the
    (shape, strides) of its four descriptors, for a plan. varlen: (cu_q, cu_k, max_q, max_k) of
    packed sequences, q, k and out then their ``packed_view``s. kv_loader: as ``fa3_forward``'s."""
    mod_args, mod_fn, input_scale = score_mod_args(score_mod, lse)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    cta_m = BLOCK_M * config["NUM_WG"]
    cu_q, cu_k, total_q, n_seq = lse, lse, 0, 0
    grid = (-(-Nq // cta_m) * B * Hq,)                       # query blocks x (batch, head)
    if varlen:   # per head, at least the pack's query blocks: sum cdiv(n, cta_m) <= that
        cu_q, cu_k, Nq, Nk = varlen
        n_seq, total_q = cu_q.numel() - 1, q.shape[2]
        grid = ((-(-total_q // cta_m) + n_seq) * Hq,)
    descs = (descriptor(q, (1, 1, BLOCK_M, D)), descriptor(k, (1, 1, config["BLOCK_N"], D)),
             v_desc, descriptor(out, (1, 1, BLOCK_M, D)))
    launch = fast_launch(_fa3_fwd_kernel, grid, *descs, lse, lse if descale is None else descale,
                         mod_args, out, cu_q, cu_k, Hq, Nq, Nk, scale * LOG2E * input_scale, Hq // Hkv,
                         B * Hkv, out.stride(2), out.stride(1), total_q, n_seq, CAUSAL=bool(causal),
                         SCORE_MOD=mod_fn, ALIBI_SPLIT=mod_fn is alibi_bias, VARLEN=bool(varlen),
                         FOLD=_fold(mod_fn, scale) if options.fa3_fold_scale else 0,
                         MAX_SEQS=max(128, triton.next_power_of_2(n_seq)), KV_LOADER=kv_loader or load_kv_ring,
                         **config,
                         **launch_options(variant), kernel_options=options)
    return launch, tuple(Descriptor.view(d) for d in descs)


def _fold(mod_fn, scale):
    """The kernel's FOLD (``_scores``): 1 for plain scores at a scale > 0, 2 / 3 for a softcap alone
    (tanh by formula / tanh.approx), 0 otherwise (and with the ``fa3_fold_scale`` option off)."""
    return {identity: int(scale > 0), tanh_softcap: 2, tanh_softcap_approx: 3}.get(mod_fn, 0)


def supported_fp8(q, k, v) -> bool:
    """Whether ``fa3_forward_fp8`` can run these inputs: as ``supported``, with float8_e4m3fn
    q, k, v (V is copied transposed by the launcher, so only q's and k's layout matter)."""
    return hopper_inputs(q, k, v, (torch.float8_e4m3fn,)) and tma_ok(q) and tma_ok(k)


def fa3_forward_fp8(q, k, v, descale, *, causal=False, scale=None, variant=None, options=None,
                    key_order=True, one_consumer_causal=False):
    """FA3's FP8 forward (section 3.3): float8_e4m3fn q, k, v, float32 ``descale`` (3, B, Hkv)
    holding Q's, K's and V's per-(batch, kv-head) factors (x = x8 * descale). Returns
    ``(out, lse)``: out bfloat16 like q's shape, lse as ``fa3_forward``'s.

    S = Q8 K8^T runs on FP8 tensor cores at twice the 16-bit rate; P is rounded to e4m3 for
    O = P V8, whose B operand 8-bit wgmma reads only K-major: the launcher copies V transposed,
    (B, Hkv, D, Nk rounded up to 32) with the keys of every 32 in the order of P's registers
    (``fp8_key_at``; ``key_order=False``: in order, rows padded to 16 bytes), about 1/(2 Nq) of
    the kernel's bytes moved. options: a ``runtime.KernelOptions`` (None: those in force).
    one_consumer_causal: run a one-consumer variant under a causal mask instead of refusing it
    (for probes: it does not always finish, see below)."""
    options = runtime.OPTIONS if options is None else options
    if not supported_fp8(q, k, v):
        raise ValueError("fa3_forward_fp8: unsupported inputs (see fa3_fwd.supported_fp8)")
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = resolve_scale(scale, D)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    if Nq == 0 or B * Hq == 0:
        return out, lse
    if Nk == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    variant = variant or DEFAULT_VARIANT_FP8[D, bool(causal)]
    if causal and VARIANTS[variant].num_wg == 1 and not one_consumer_causal:   # not understood yet
        raise ValueError(f"fa3_forward_fp8: variant {variant!r} (one consumer) does not finish causal FP8 "
                         "at d64 where two of its CTAs of unequal work share an SM (one CTA an SM runs); "
                         "use a two-consumer variant")
    config = kernel_config(variant, D, fp8=True, smem_bytes=options.fa3_smem_bytes, key_order=key_order)
    if config["KEY_ORDER"]:   # keys past Nk read as the zeros written there
        v_t = transpose_rows(v, -(-Nk // 32) * 32, key_order=True)
        v_desc = descriptor(v_t, (1, 1, D, config["BLOCK_N"]))
    else:                     # columns past Nk: outside the descriptor's bounds
        v_t = transpose_rows(v, -(-Nk // 16) * 16)
        v_desc = descriptor(v_t, (1, 1, D, config["BLOCK_N"]), shape=(B, Hkv, D, Nk))
    _launch(q, k, v_desc, out, lse, causal, scale, descale.contiguous(), variant, config, options)
    return out, lse


@triton.jit
def fp8_key_at(col):
    """The key whose row column ``col`` of V^T holds with KEY_ORDER (``_p_operand``): within each
    32 columns, column 16 c1 + 4 q + 2 c0 + b holds key 16 c1 + 8 c0 + 2 q + b, the key whose P
    the S accumulator keeps in the register that the 8-bit wgmma A fragment reads for that column."""
    r = col % 32
    return col - r + (r & 17) + ((r >> 1) & 1) * 8 + ((r >> 2) & 3) * 2


@triton.jit
def _transpose_kernel(X, Y, N, D, n_blocks, Hkv, stride_xb, stride_xh, stride_xn, stride_yb, stride_yh,
                      stride_yd, WIDTH, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, KEY_ORDER: tl.constexpr):
    """Y[b, h, d, n] = X[b, h, n, d] for one (BLOCK_N, BLOCK_D) tile a program (bytes); KEY_ORDER:
    column n holds key ``fp8_key_at(n)`` (rows gathered, stores contiguous), zeros past key N, up
    to WIDTH columns."""
    bh, start_n = tl.program_id(0) // n_blocks, tl.program_id(0) % n_blocks * BLOCK_N
    b, h = (bh // Hkv).to(tl.int64), (bh % Hkv).to(tl.int64)
    cols = start_n + tl.arange(0, BLOCK_N)                                     # (BN,)
    offs_d = tl.arange(0, BLOCK_D)                                             # (BD,)
    if KEY_ORDER:
        keys, n_end = fp8_key_at(cols), WIDTH
    else:
        keys, n_end = cols, N
    x = tl.load(X + b * stride_xb + h * stride_xh + keys[:, None].to(tl.int64) * stride_xn + offs_d[None, :],
                mask=(keys[:, None] < N) & (offs_d[None, :] < D), other=0)    # (BN, BD)
    tl.store(Y + b * stride_yb + h * stride_yh + offs_d[:, None] * stride_yd + cols[None, :], tl.trans(x),
             mask=(offs_d[:, None] < D) & (cols[None, :] < n_end))            # (BD, BN)


def transpose_rows(v, width, key_order=False):
    """v (B, H, N, D) of 1-byte elements -> (B, H, D, width) with [..., :N] = v^T (the rest
    unset): FP8's V^T, which 8-bit wgmma needs for its B operand. key_order: column n holds key
    ``fp8_key_at(n)``, zeros past the last key, up to ``width`` (a multiple of 32). A tiled kernel:
    torch's strided copy (``out[..., :N].copy_(v.transpose(2, 3))``) of 1-byte elements is several
    times slower (benchmarks/probes/fp8_transpose_time.py, NOTES.md)."""
    B, H, N, D = v.shape
    if key_order and width % 32:
        raise ValueError(f"transpose_rows: width {width} must be a multiple of 32 with key_order")
    out = torch.empty((B, H, D, width), dtype=v.dtype, device=v.device)
    block_n, block_d = 64, padded_headdim(D)
    n_blocks = cdiv(width if key_order else N, block_n)   # key order: the zeros past N too
    if out.numel() == 0 or n_blocks == 0:
        return out
    x, y = (v if v.stride(-1) == 1 else v.contiguous()).view(torch.uint8), out.view(torch.uint8)
    launch.run(_transpose_kernel, (B * H * n_blocks,), x, y, N, D, n_blocks, H, *x.stride()[:3],
               *y.stride()[:3], width, BLOCK_N=block_n, BLOCK_D=block_d, KEY_ORDER=key_order, num_warps=4)
    return out
