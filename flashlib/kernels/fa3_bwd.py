"""FlashAttention-3 backward for Hopper (sm90) in Gluon: TMA, warp specialisation, async wgmma.

Follows Shah et al., "FlashAttention-3" (2024), section 3 and its appendix on the backward pass
(Algorithm 3), with flashlib's FA2 contract (``fa2_bwd.fa2_backward``: same inputs and outputs,
bottom-right causal, grouped heads):

- one CTA per (key block, batch, kv head). Its K and V blocks stay in shared memory (one TMA load
  each); a *producer* partition (one warp) streams the Q and dO blocks of every query block that
  sees those keys, for each query head of the K/V head's group, through a ring of STAGES stages;
- *consumer* warpgroups (4 warps each, NUM_WG per CTA) each own 64 keys of the block (a wgmma's M)
  and, per query block (BLOCK_M rows), compute with async wgmma (written here as FA2's dK/dV
  kernel's transposed tiles): S^T = K Q^T and dP^T = V dO^T (issued back to back), P^T = exp2(S^T * scale log2e - lse log2e),
  dV += P^T dO, dS^T = P^T * (dP^T - delta), dK += dS^T Q, and dQ_partial = dS K in column
  slices of DQ_N (its accumulator beside dK and dV; with query rows along M the first slice is
  issued before dK, whose wgmma then runs under that slice's store: the ``fa3_dq_before_dk``
  option, ``benchmarks/probes/fa3_bwd_order_probe.py``). KEYS_M keeps P^T in
  registers (the A operand of dV); otherwise S and dP have the query rows along M (FA3's layout:
  lse and delta 2 registers a thread) and P goes through shared memory. dS always does (dK and dQ
  read it);
- DQ_SPLIT (the ``2wg_split`` variant): FA3's division of dQ between the two
  consumers. Each computes half of dQ's columns over all 128 keys, dS_0 K_0 + dS_1 K_1, reading
  the other consumer's dS (double-buffered by step parity) and K. An mbarrier, ``ds_ready`` (one
  arrival per consumer a step), says both dS are stored; one more round of it at the end keeps
  dK from overwriting a K buffer the other consumer's last dQ still reads. A step then makes one
  block_m x D/2 TMA reduce-add per consumer instead of two block_m x D/2 slices each;
- ``wide`` (the d64 default without a score modifier): one consumer of 8 warps, two warpgroups,
  with 128 keys and 128 query rows a step. Every tile's rows are split between its warpgroups by
  the wgmma layout itself (S and dP: query rows; dK and dV: keys), so each reads the other's P and
  dS rows from shared memory, ordered by the compiler's bar.sync over the partition's 256 threads
  instead of mbarriers between partitions; dQ's rows are each warpgroup's own (one reduce-add a
  step for the CTA). A step is twice the two-consumer step's matmul work for the same per-step
  costs (waits, barriers, loads issued, one reduce-add). At d128 it cannot fit: S, dP, dK and dV
  take 64 registers a thread each, over the 240 a consumer thread gets. ``wide_m64`` (the d128
  default, with a score modifier too) takes 64 query rows a step: the warpgroups split S's and
  dP's keys and dQ's columns instead of rows (32 registers each for S and dP), and it fits at d128;
- dQ as FA3 accumulates it: the float32 partial goes to shared memory and one TMA reduce-add
  (``cp.reduce.async.bulk.tensor``, clipped at Nq) adds it into a float32 ``dq_accum``
  (DQ_TMA; otherwise ``atomic_add`` from registers); a last small kernel scales it and casts it.
  A first one computes delta = rowsum(dO * O) and lse in base 2, padded to whole query blocks.

The score-modifier hook (``kernels.score_mod``: softcap, ALiBi) runs on the scaled S^T or S before
the mask and exp2, as in ``fa2_bwd``; its derivative multiplies dS. With a modifier dP is issued
after P, for registers (``_step_rows_m``); the identity compiles to the plain kernel.

dK and dV (scaled, cast) leave through the K and V buffers and TMA stores clipped at Nk. Q, dO,
K, V, dK, dV and dq_accum move through 4-D descriptors (batch, head, row, dim): TMA zero-fills
rows past a head's length, so ragged tails never touch the next head. Padded query rows have
lse = +inf (P = 0) and delta = 0; a row with no visible key has lse = -inf, read as +inf: its P,
and so its gradients, are 0, never NaN. Keys past Nk and the causal band are masked (P = 0).

Packed sequences (VARLEN, ``cu_seqlens``, as ``fa3_fwd``'s): the descriptors cover the
``fa3_fwd.packed_view``s (1, H, total, D) of q, dO, k, v, dK, dV; the grid covers the longest
sequence's key blocks and a CTA past its sequence's last one exits before anything else. Each
partition loads its sequence's first rows and lengths itself (``_sequence``), so Nq, Nk, row0
and n0 count within the sequence: the causal band (bottom-right in each) and the modifiers'
positions are the sequence's. A query block's rows past Nq are the next sequence's, not TMA's
zeros: their lse2 and delta, (Hq, total_q) here, are read as +inf and 0 (``_row_stats``), so their
P, dS and dQ partials are 0 and the reduce-add into the next sequence's dq_accum rows adds zeros.
Keys past Nk are masked as ragged tails are, but their dK and dV rows are another CTA's: a
sequence's last key block leaves by a masked store from registers, full blocks by TMA. dq_accum
is (1, Hq, total_q, D); the preprocess and convert kernels see one batch entry of total_q rows.
For sm90 it compiles without spills at d64 (``wide`` with ALiBi: 52-256 bytes, why it is not
the default with a modifier); at d128 the variants spill (the default 80-96 bytes a thread;
packed sequences' 2wg 220-236: hopper_bwd_compile_check), a few more local loads per step.

One CTA, producer and 2 consumers (t: step over (query head, query block); s = t % STAGES)::

    producer   | TMA K_w,V_w | wait empty[s], TMA Q_t -> q_ready[s], TMA dO_t -> do_ready[s] | ...
    consumer w | wait kv | wait q_ready: S | wait do_ready: dP | P | dV | dS | dQ slice 0, dK
               | slice 0 -> smem, TMA reduce-add | other slices ... | wait dK, arrive empty[s]
               | next step ... | dK, dV -> smem, TMA store

    kv_bar           TMA -> consumers        (count 1 + K's and V's bytes)
    q_ready/do_ready TMA -> consumers        (count 1 + the block's bytes)
    empty            consumers -> producer   (count NUM_WG: each once its last wgmma reading
                                              the stage, dK += dS^T Q, has completed)
    ds_ready         consumer <-> consumer   (DQ_SPLIT; count 2: the t-th step waits parity t & 1,
                                              the end round n_steps & 1)

Phases as in fa3_fwd: the t-th step waits ``ready`` with parity (t // STAGES) & 1, the producer
``empty`` with the opposite parity (a fresh barrier passes it: the first STAGES loads go ahead).
Every partition runs the same number of steps (VARLEN: each computes it from the same
offsets), so no barrier gets two phases ahead.

``VARIANTS`` names the combinations; ``benchmarks/probes/hopper_bwd_probe.py`` checks and times them,
``benchmarks/probes/hopper_bwd_compile_check.py`` compiles them without a GPU and models the protocol.
Written for Triton 3.6's ``triton.experimental.gluon`` (its TMA reduce is reached through the
builder, Gluon 3.6 has no Python wrapper for it). Importing never fails: on another Triton, or
without Gluon's Hopper module, the kernels are not defined and ``supported`` is False.
"""
from typing import NamedTuple, Optional

import torch

from .. import runtime
from ..inputs import resolve_scale
from . import fa3_fwd
from .fa3_fwd import descriptor, tma_ok
from .launch import Descriptor, fast_launch, plan_key, remember
from .score_mod import identity as _identity
from .score_mod import kernel_args as score_mod_args
from .tile import LOG2E

TESTED_TRITON = ("3.6.",)   # Gluon's API as this file uses it; other releases fall back to FA2

try:   # Gluon's Hopper API; absent or different elsewhere: fall back to FA2
    import triton
    import triton.language as tl
    from triton._C.libtriton import ir as _ir
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin as _builtin
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    _GLUON = triton.__version__.startswith(TESTED_TRITON) and hasattr(_ir, "DESCRIPTOR_REDUCE_KIND")
except Exception:   # noqa: BLE001  (ImportError, or a renamed symbol in another release)
    _GLUON = False

HEAD_DIMS = (64, 128)
BLOCK_N = 64            # keys per consumer warpgroup: 4 warps x 16 rows, wgmma's M per warpgroup
SMEM_BYTES = 232448     # H100/H200 shared memory per block (227 KiB)
SMEM_SPARE = 8192       # kept for the barriers and the compiler's own scratch
MAX_STAGES = 4
DQ_N = 64               # dQ = dS K in column slices this wide (the accumulator's registers)


class Variant(NamedTuple):
    """One way to run the kernel. num_wg: consumer warpgroups (the CTA's key block is num_wg x 64
    keys); block_m: query rows per step; keys_m: keys along wgmma's M in S^T and dP^T (P^T stays
    in registers; lse and delta cost 2 x block_m / 4 registers a thread) or, False, query rows
    (FA3's layout: P through shared memory, lse and delta 2 registers each); dq_tma: dQ partials
    through shared memory and a TMA reduce-add (else atomic_add from registers); regs: registers
    per consumer thread (setmaxnreg) with several consumers; head_dims: where it compiles
    without spills (hopper_bwd_compile_check); dq_split: dQ's columns divided between the two
    consumers (FA3's layout): each computes half of dQ's columns from both consumers' dS (double
    buffered in shared memory, a barrier between them a step), one TMA reduce-add of
    block_m x D/2 each instead of block_m x D. block_n: keys per consumer, 16 a warp: 64 (one
    warpgroup) or 128 (one consumer of two warpgroups, every tile split between them: dK and dV by
    keys, S, dP and dQ by query rows, or with 64 query rows by keys and dQ's columns; its barriers
    between them are bar.sync, not mbarriers)."""
    num_wg: int
    block_m: int
    keys_m: bool
    dq_tma: bool
    regs: int
    head_dims: tuple
    about: str
    dq_split: bool = False
    block_n: int = BLOCK_N


VARIANTS = {
    "simple": Variant(1, 64, False, False, 0, (64, 128), "producer + 1 consumer (64 keys), dQ atomics"),
    "1wg": Variant(1, 64, False, True, 0, (64, 128), "producer + 1 consumer (64 keys), dQ TMA reduce"),
    "1wg_keys_m": Variant(1, 64, True, True, 0, (64,), "as 1wg, keys along M (P^T in registers)"),
    "2wg": Variant(2, 64, False, True, 240, (64, 128), "2 consumers (128 keys), dQ TMA reduce"),
    "2wg_atomic": Variant(2, 64, False, False, 240, (64, 128), "2 consumers (128 keys), dQ atomics"),
    "2wg_keys_m": Variant(2, 64, True, True, 240, (64,), "as 2wg, keys along M (P^T in registers)"),
    "2wg_split": Variant(2, 64, False, True, 240, (64, 128), "as 2wg, dQ's columns split between the consumers",
                         dq_split=True),
    "wide": Variant(1, 128, False, True, 240, (64,), "one consumer of 8 warps: 128 keys x 128 query rows a "
                    "step, dQ TMA reduce", block_n=128),
    # compiled for sm90 without spills at d64 and d128 (hopper_bwd_compile_check; 2wg_split spills
    # 80-96 bytes at d128)
    "wide_m64": Variant(1, 64, False, True, 240, (64, 128), "as wide, 64 query rows a step: S's keys and "
                        "dQ's columns split between the two warpgroups", block_n=128),
    # 128 query rows a step in two consumers of 64 keys spilled over 1 KB a thread at d64 (Triton
    # 3.6; S and dP 64 registers each beside dK, dV, and a 128-row dQ partial): "wide" instead
}
# the variant ahead at each head dim, dense and packed (benchmarks/probes/fa3_bwd_split_ab.py and
# fa3_bwd_packed_ab.py; numbers: NOTES.md); with a score modifier at d64 "wide" spills and 2wg leads
DEFAULT_VARIANT = {64: "wide", 128: "wide_m64"}
DEFAULT_VARIANT_MODIFIED = {64: "2wg", 128: "wide_m64"}


def kernel_config(variant: str, D: int, elem_bytes: int = 2, smem_bytes: Optional[int] = None,
                  dq_before_dk: bool = True) -> dict:
    """The kernel's constexprs for ``variant`` at head dim D: the Q/dO ring as deep as fits beside
    K and V (num_wg x block_n x D each), dS (and P unless keys_m; num_wg x block_n x block_m each;
    dq_split: two dS buffers) and, with dq_tma, a float32 dQ slice per consumer (block_m x
    min(D, DQ_N); dq_split: D / 2; two warpgroups in the consumer: D), in ``smem_bytes`` (None:
    ``SMEM_BYTES``). dq_before_dk: dQ's first slice issued before dK's wgmma (rows along M;
    dq_split always)."""
    v = VARIANTS[variant]
    if D not in v.head_dims:
        raise ValueError(f"variant {variant!r} is for head dims {v.head_dims}, not {D}")
    # two warpgroups in one consumer: all of D at once, split between them as S is (by query rows,
    # or with 64 of them by columns)
    dq_n = D // 2 if v.dq_split else D if v.block_n > BLOCK_N else min(D, DQ_N)
    tiles = 1 if v.keys_m else (3 if v.dq_split else 2)            # dS (twice with dq_split), P
    fixed = (2 * D + tiles * v.block_m) * v.num_wg * v.block_n * elem_bytes
    if v.dq_tma:
        fixed += v.num_wg * v.block_m * dq_n * 4
    smem_bytes = SMEM_BYTES if smem_bytes is None else smem_bytes
    stages = min(MAX_STAGES, (smem_bytes - SMEM_SPARE - fixed) // (2 * v.block_m * D * elem_bytes))
    if stages < 1:
        raise ValueError(f"variant {variant!r} does not fit shared memory at head dim {D}")
    return dict(BLOCK_M=v.block_m, BLOCK_N=v.block_n, HEAD_D=D, NUM_WG=v.num_wg, STAGES=stages,
                DQ_TMA=v.dq_tma, KEYS_M=v.keys_m, DQ_N=dq_n, CONSUMER_REGS=v.regs or 240,
                DQ_FIRST=(dq_before_dk or v.dq_split) and not v.keys_m, DQ_SPLIT=v.dq_split)


def launch_options(variant: str) -> dict:
    """A warp per 16 keys (the default partition is consumer 0); with one consumer a launch register
    count that setmaxnreg moves to it from the producer, as in fa3_fwd: the count times the CTA's
    threads (the producer's warp padded to a warpgroup) is what it divides, 128 x 256 giving one
    consumer warpgroup 232 registers a thread, 168 x 384 two 240."""
    v = VARIANTS[variant]
    return dict(num_warps=v.block_n // 16,
                **({"maxnreg": 128 if v.block_n == 64 else 168} if v.num_wg == 1 else {}))


if _GLUON:
    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """cp.reduce.async.bulk.tensor .add of the shared-memory block ``src`` into the global
        block at ``coord`` (clipped at the tensor's bounds); completes like a TMA store
        (``tma.store_wait``). Gluon 3.6 builds the op but exports no wrapper."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                                  coord, src.handle)

    @triton.jit
    def _preprocess_kernel(Out, dOut, Lse, Lse2, Delta, stride_ob, stride_oh, stride_om,
                           stride_dob, stride_doh, stride_dom, Hq, Nq, Nq_pad,
                           HEAD_D: tl.constexpr, ROWS: tl.constexpr):
        """delta = rowsum(dO * O) and lse * log2(e) (-inf -> +inf) into (B * Hq, Nq_pad) buffers;
        rows Nq..Nq_pad: delta 0, lse +inf (their P is 0)."""
        bh = tl.program_id(1)
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, HEAD_D)
        ok = rows < Nq
        b, h = bh // Hq, bh % Hq
        rows64 = rows.to(tl.int64)[:, None]   # packed rows are Hq x D apart: past 2^31 elements
        o = tl.load(Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                    + rows64 * stride_om + cols[None, :], mask=ok[:, None], other=0.0)
        do = tl.load(dOut + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
                     + rows64 * stride_dom + cols[None, :], mask=ok[:, None], other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        lse = tl.load(Lse + bh.to(tl.int64) * Nq + rows, mask=ok, other=float("-inf"))
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        out_rows = bh.to(tl.int64) * Nq_pad + rows
        tl.store(Delta + out_rows, delta, mask=rows < Nq_pad)
        tl.store(Lse2 + out_rows, lse2, mask=rows < Nq_pad)

    @triton.jit
    def _convert_dq_kernel(DqAccum, dQ, stride_qb, stride_qh, stride_qm, Hq, Nq, scale,
                           HEAD_D: tl.constexpr, ROWS: tl.constexpr):
        """dQ = scale * dq_accum, cast to dQ's dtype."""
        bh = tl.program_id(1)
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, HEAD_D)
        ok = rows[:, None] < Nq
        acc = tl.load(DqAccum + (bh.to(tl.int64) * Nq + rows[:, None]) * HEAD_D + cols[None, :], mask=ok)
        b, h = bh // Hq, bh % Hq
        tl.store(dQ + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
                 + rows.to(tl.int64)[:, None] * stride_qm + cols[None, :],   # int64: as above
                 (acc * scale).to(dQ.dtype.element_ty), mask=ok)

    @gluon.jit
    def _steps(Nq, Nk, start_n, GROUP, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
        """The query blocks that see a key of the CTA's block (from start_n): [m_lo, m_lo + n_mb)
        of each query head of the group, n_steps in all. Returns (m_lo, n_mb, n_steps)."""
        n_m = gl.cdiv(Nq, BLOCK_M)
        if CAUSAL:
            lo_row = gl.maximum(start_n - (Nk - Nq), 0)
            m_lo = gl.minimum(lo_row // BLOCK_M, n_m)
        else:
            m_lo = 0
        n_mb = n_m - m_lo
        n_steps = GROUP * n_mb
        n_mb = gl.maximum(n_mb, 1)      # a divisor in the partitions (unused when n_steps == 0)
        return m_lo, n_mb, n_steps

    @gluon.jit
    def _sequence(CuSeqQ, CuSeqK, off_b):
        """VARLEN: batch entry off_b's first rows and lengths (q_row0, k_row0, Nq, Nk), as
        fa2_fwd.sequence. Each partition loads them and derives its steps itself: values the
        kernel's body loaded would reach it through shared memory and without what the compiler
        knew of them (the step loop's t // n_mb became a signed division). The dense schedule
        comes from the kernel's arguments alone: Triton recomputes it in each partition."""
        q_row0 = gl.load(CuSeqQ + off_b)
        k_row0 = gl.load(CuSeqK + off_b)
        Nq = gl.load(CuSeqQ + off_b + 1) - q_row0
        Nk = gl.load(CuSeqK + off_b + 1) - k_row0
        return q_row0, k_row0, Nq, Nk

    @gluon.jit
    def _producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, q_ready,
                  do_ready, empty, off_b, off_hkv, start_n, m_lo, n_mb, n_steps, GROUP, CuSeqQ, CuSeqK,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, VARLEN: gl.constexpr):
        """One warp: TMA loads of each consumer's K and V rows, then Q and dO step by step."""
        tma_b = off_b      # the descriptors' batch coordinate
        q_row0 = 0         # the sequence's first rows
        k_row0 = 0
        if VARLEN:   # the sequence's rows and steps, not the kernel body's (see _sequence)
            q_row0, k_row0, Nq, Nk = _sequence(CuSeqQ, CuSeqK, off_b)
            m_lo, n_mb, n_steps = _steps(Nq, Nk, start_n, GROUP, BLOCK_M, CAUSAL)
            tma_b = 0
        mbarrier.expect(kv_bar, NUM_WG * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
        for w in gl.static_range(NUM_WG):
            tma.async_copy_global_to_shared(k_desc, [tma_b, off_hkv, k_row0 + start_n + w * BLOCK_N, 0],
                                            kv_bar, k_smem.index(w))
            tma.async_copy_global_to_shared(v_desc, [tma_b, off_hkv, k_row0 + start_n + w * BLOCK_N, 0],
                                            kv_bar, v_smem.index(w))
        for t in range(n_steps):
            s = t % STAGES
            g = t // n_mb
            row0 = (m_lo + t - g * n_mb) * BLOCK_M
            off_h = off_hkv * GROUP + g
            mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
            mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [tma_b, off_h, q_row0 + row0, 0], q_ready.index(s),
                                            q_smem.index(s))
            mbarrier.expect(do_ready.index(s), do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [tma_b, off_h, q_row0 + row0, 0], do_ready.index(s),
                                            do_smem.index(s))

    @gluon.jit
    def _row_stats(lse2_ptr, delta_ptr, rows, n_rows, VARLEN: gl.constexpr):
        """lse2 and delta of a step's query rows (rows: 0..BLOCK_M in the tile's layout). Dense, the
        buffers are padded to whole query blocks: no bounds. VARLEN: rows from n_rows on are the
        next sequence's (or past the packed end): lse2 +inf and delta 0, so their P and dS are 0."""
        if VARLEN:
            lse2 = gl.load(lse2_ptr + rows, mask=rows < n_rows, other=float("inf"))
            delta = gl.load(delta_ptr + rows, mask=rows < n_rows, other=0.0)
        else:
            lse2 = gl.load(lse2_ptr + rows)
            delta = gl.load(delta_ptr + rows)
        return lse2, delta

    @gluon.jit
    def _step_keys_m(k, v, q_smem, do_smem, q_bar, do_bar, phase, ds_view, dk, dv, lse2_ptr, delta_ptr,
                     n_rows, row0, n0, full_row, causal_offset, Nk, qk_scale, bh, mod_args,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                     CAUSAL: gl.constexpr, SCORE_MOD: gl.constexpr, VARLEN: gl.constexpr):
        """One query block, keys along wgmma's M (FA2's dK/dV tiles): S^T = K Q^T, dP^T = V dO^T;
        P^T stays in registers (the A operand of dV += P^T dO); dS^T goes to shared memory for
        dK += dS^T Q and dQ = dS K (read transposed). SCORE_MOD on the scaled S^T, as
        ``fa2_bwd.dkdv_tile``; its derivative scales dS^T. With a modifier, dP^T after P^T and P^T
        packed beside P^T dmod, as in ``_step_rows_m``. n_rows: the step's rows in its sequence
        (VARLEN, ``_row_stats``). Returns (dk, dv)."""
        dtype: gl.constexpr = k.dtype
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, HEAD_D, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))       # query rows
        lse2, delta = _row_stats(lse2_ptr, delta_ptr, cols, n_rows, VARLEN)
        mbarrier.wait(q_bar, phase)
        q = q_smem.reshape([BLOCK_M, HEAD_D])
        st = warpgroup_mma(k, q.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout),
                           use_acc=False, is_async=True)
        do = do_smem.reshape([BLOCK_M, HEAD_D])
        dpt_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        if SCORE_MOD is _identity:   # (a compile-time test) dP^T beside the softmax
            mbarrier.wait(do_bar, phase)
            dpt = warpgroup_mma(v, do.permute((1, 0)), dpt_zero, use_acc=False, is_async=True)
            st = warpgroup_mma_wait(1, deps=(st, ))                  # S^T done, dP^T may run on
        else:
            st = warpgroup_mma_wait(0, deps=(st, ))
        # the modifier's positions (the identity's compile away): query rows on the key axis, keys
        # (2 a thread: cheap to hold)
        q_pos = row0 + causal_offset + cols
        k_pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
        st, dmod = SCORE_MOD(st * qk_scale, gl.expand_dims(q_pos, 0), gl.expand_dims(k_pos, 1), bh,
                             mod_args)
        pt = gl.exp2(st - gl.expand_dims(lse2, 0))
        ptd = pt * dmod                 # dS^T's factor; the identity's: P^T itself
        if len(dmod.shape) > 0:         # (compile time) a derivative tile: P^T on in 16 bits
            pt = pt.to(dtype)
        if row0 < full_row:   # uniform branch: the causal band or the ragged key tail
            # key n0 + j, query row0 + i: visible iff n0 + j < Nk and (causal) n0 + j <= row0 + i +
            # Nk - Nq. The query positions are computed here, from row0: loop-invariant key or
            # query vectors would be hoisted out of the loop and held in registers throughout
            keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))    # 2 a thread
            visible = gl.expand_dims(keys < Nk, 1)
            if CAUSAL:
                visible = visible & (gl.expand_dims(keys - causal_offset, 1) <= gl.expand_dims(row0 + cols, 0))
            pt = gl.where(visible, pt, 0.0)
            ptd = gl.where(visible, ptd, 0.0)
        p_op = gl.convert_layout(pt.to(dtype), op_layout)
        if SCORE_MOD is not _identity:
            mbarrier.wait(do_bar, phase)
            dpt = warpgroup_mma(v, do.permute((1, 0)), dpt_zero, use_acc=False, is_async=True)
        dv = warpgroup_mma(p_op, do, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=(dpt, ))                    # dP^T done, dV may run on
        dst = (ptd * (dpt - gl.expand_dims(delta, 0))).to(dtype)
        ds_view.store(dst)
        fence_async_shared()
        dk = warpgroup_mma(ds_view, q, dk, is_async=True)
        dv, dk, p_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op))
        return dk, dv

    @gluon.jit
    def _step_rows_m(k, v, q_smem, do_smem, q_bar, do_bar, phase, ds_view, p_view, dk, dv, lse2_ptr,
                     delta_ptr, n_rows, row0, n0, full_row, causal_offset, Nk, qk_scale, bh, mod_args,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                     CAUSAL: gl.constexpr, SCORE_MOD: gl.constexpr, VARLEN: gl.constexpr,
                     DQ_FIRST: gl.constexpr):
        """One query block, query rows along wgmma's M (FA3's SdP without swapAB): S = Q K^T,
        dP = dO V^T, lse and delta two registers a thread; P and dS go to shared memory, read
        transposed by dV += P^T dO and dK += dS^T Q, and as is by dQ = dS K. SCORE_MOD on the
        scaled S, as ``fa2_bwd.dq_tile``; its derivative scales dS.

        With a modifier, dP is issued after P (its accumulator not in flight through the
        modifier's work) and, when the derivative is a tile (the softcap's), P crosses the mask in
        16 bits beside P dmod in float32: written as the plain kernel, the 2wg variant's softcap
        spilled 816-1008 bytes a thread at d128 and ALiBi with it 1472-1736 (Triton 3.6,
        hopper_bwd_compile_check), this way 8 and 224-384. Without one (the identity, a
        compile-time test) the kernel is the plain one: dP beside the softmax. n_rows: as
        ``_step_keys_m``'s. Returns (dk, dv); DQ_FIRST: dV still in flight and dK not issued
        (the consumer issues it after dQ's first slice)."""
        dtype: gl.constexpr = k.dtype
        # the consumer's warps down the query rows, 16 each; two warpgroups over 64 rows split
        # the keys instead
        WARPS: gl.constexpr = BLOCK_N // 16
        ACROSS: gl.constexpr = 1 if BLOCK_M >= 16 * WARPS else 16 * WARPS // BLOCK_M
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0],
                                                           warps_per_cta=[WARPS // ACROSS, ACROSS],
                                                           instr_shape=[16, BLOCK_N // ACROSS, 16])
        rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        lse2, delta = _row_stats(lse2_ptr, delta_ptr, rows, n_rows, VARLEN)
        mbarrier.wait(q_bar, phase)
        q = q_smem.reshape([BLOCK_M, HEAD_D])
        s = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                          use_acc=False, is_async=True)
        do = do_smem.reshape([BLOCK_M, HEAD_D])
        dp_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        if SCORE_MOD is _identity:
            mbarrier.wait(do_bar, phase)
            dp = warpgroup_mma(do, v.permute((1, 0)), dp_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))                    # S done, dP may run on
        else:
            s = warpgroup_mma_wait(0, deps=(s, ))
        # the modifier's positions (the identity's compile away): query rows on the key axis, and
        # keys written from row0 as the mask's below, so that they depend on the step: n0 + j would
        # be hoisted out of the loop, 16 values a thread held throughout (ALiBi at d128: 456-472
        # bytes of spill, 188-324 this way)
        q_pos = row0 + causal_offset + rows
        k_pos = (row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))) + (n0 - row0)
        s, dmod = SCORE_MOD(s * qk_scale, gl.expand_dims(q_pos, 1), gl.expand_dims(k_pos, 0), bh,
                            mod_args)
        p = gl.exp2(s - gl.expand_dims(lse2, 1))
        pd = p * dmod                   # dS's factor; the identity's: P itself (one mask below)
        if len(dmod.shape) > 0:         # (compile time) a derivative tile: P on in 16 bits
            p = p.to(dtype)
        if row0 < full_row:   # uniform branch: the causal band or the ragged key tail
            # key n0 + j, query row0 + i: visible iff j < Nk - n0 and (causal) j <= row0 + i +
            # Nk - Nq - n0; both sides shifted by row0 so that the key vector (16 values a thread)
            # depends on the step: a loop-invariant one would be hoisted out of the loop and held
            # in registers throughout (it spilled at d128)
            keys = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))   # j + row0
            last = Nk - 1 - n0 + row0
            if CAUSAL:
                lim = gl.minimum(rows + (2 * row0 + causal_offset - n0), last)
                visible = gl.expand_dims(keys, 0) <= gl.expand_dims(lim, 1)
            else:
                visible = gl.expand_dims(keys <= last, 0)
            p = gl.where(visible, p, 0.0)
            pd = gl.where(visible, pd, 0.0)
        p_view.store(p.to(dtype))
        fence_async_shared()
        if SCORE_MOD is not _identity:
            mbarrier.wait(do_bar, phase)
            dp = warpgroup_mma(do, v.permute((1, 0)), dp_zero, use_acc=False, is_async=True)
        dv = warpgroup_mma(p_view.permute((1, 0)), do, dv, is_async=True)
        dp = warpgroup_mma_wait(1, deps=(dp, ))                      # dP done, dV may run on
        ds_view.store((pd * (dp - gl.expand_dims(delta, 1))).to(dtype))
        fence_async_shared()
        if not DQ_FIRST:
            dk = warpgroup_mma(ds_view.permute((1, 0)), q, dk, is_async=True)
            dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
        return dk, dv

    @gluon.jit
    def _consumer(dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem,
                  dq_smem, kv_bar, q_ready, do_ready, empty, ds_ready, Lse2, Delta, DqAccum, dK, dV, off_b,
                  off_hkv, start_n, m_lo, n_mb, n_steps, GROUP, Hq, Nq, Nk, Nq_pad, scale, qk_scale,
                  ModArgs, CuSeqQ, CuSeqK, stride_dkm, stride_dkh, WG: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, DQ_TMA: gl.constexpr,
                  KEYS_M: gl.constexpr, DQ_N: gl.constexpr, SCORE_MOD: gl.constexpr,
                  VARLEN: gl.constexpr, DQ_FIRST: gl.constexpr, DQ_SPLIT: gl.constexpr):
        """One warpgroup: dK, dV of keys [n0, n0 + 64) over every step; dQ partials out (DQ_SPLIT:
        dQ = dS K's columns [WG x DQ_N, (WG + 1) x DQ_N) over both consumers' keys). Nq, Nk,
        row0 and n0 count within the sequence; VARLEN: its rows start at q_row0 and k_row0 of the
        packed tensors, and a sequence's last key block leaves by masked stores into dK and dV
        (rows stride_dkm, heads stride_dkh apart)."""
        dtype: gl.constexpr = dk_desc.dtype
        WARPS: gl.constexpr = BLOCK_N // 16     # the consumer's, 16 keys (and query rows) each
        ACROSS: gl.constexpr = 1 if BLOCK_M >= 16 * WARPS else 16 * WARPS // BLOCK_M   # as S's
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                             instr_shape=[16, HEAD_D, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0],
                                                            warps_per_cta=[WARPS // ACROSS, ACROSS],
                                                            instr_shape=[16, DQ_N // ACROSS, 16])
        tma_b = off_b
        q_row0 = 0
        k_row0 = 0
        if VARLEN:   # as the producer's
            q_row0, k_row0, Nq, Nk = _sequence(CuSeqQ, CuSeqK, off_b)
            m_lo, n_mb, n_steps = _steps(Nq, Nk, start_n, GROUP, BLOCK_M, CAUSAL)
            tma_b = 0
        n0 = start_n + WG * BLOCK_N
        causal_offset = Nk - Nq
        # steps whose query block starts at or after full_row see all 64 keys: no mask there
        # (keys past Nk always need one: their K rows are zeros, or VARLEN the next sequence's,
        # and P = exp2(-lse) may overflow)
        if n0 + BLOCK_N > Nk:
            full_row = Nq + BLOCK_M
        elif CAUSAL:
            full_row = n0 + BLOCK_N - 1 - causal_offset
        else:
            full_row = 0

        dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, acc_layout)
        k = k_smem.index(WG).reshape([BLOCK_N, HEAD_D])
        v = v_smem.index(WG).reshape([BLOCK_N, HEAD_D])
        mbarrier.wait(kv_bar, 0)            # always: dK and dV leave through these buffers
        for t in range(n_steps):
            s = t % STAGES
            g = t // n_mb
            row0 = (m_lo + t - g * n_mb) * BLOCK_M
            off_h = off_hkv * GROUP + g
            bh = off_b * Hq + off_h                   # the modifier's row: per query head
            if VARLEN:   # (Hq, total_q) rows, Nq_pad = total_q
                stat_row = off_h.to(gl.int64) * Nq_pad + q_row0 + row0
            else:
                stat_row = bh.to(gl.int64) * Nq_pad + row0
            if KEYS_M:
                dk, dv = _step_keys_m(k, v, q_smem.index(s), do_smem.index(s), q_ready.index(s),
                                      do_ready.index(s), (t // STAGES) & 1, ds_smem.index(WG), dk, dv,
                                      Lse2 + stat_row, Delta + stat_row, Nq - row0, row0, n0, full_row,
                                      causal_offset, Nk, qk_scale, bh, ModArgs, BLOCK_M, BLOCK_N,
                                      HEAD_D, CAUSAL, SCORE_MOD, VARLEN)
                ds = ds_smem.index(WG).permute((1, 0))              # dS (BLOCK_M, 64)
            else:
                # DQ_SPLIT: dS double-buffered, the other consumer reads this step's buffer while
                # this one writes the next (a buffer's next writer has passed ds_ready after its
                # reader's last wgmma on it completed)
                buf = 0
                if DQ_SPLIT:
                    buf = (t % 2) * 2
                dk, dv = _step_rows_m(k, v, q_smem.index(s), do_smem.index(s), q_ready.index(s),
                                      do_ready.index(s), (t // STAGES) & 1, ds_smem.index(buf + WG),
                                      p_smem.index(WG), dk, dv, Lse2 + stat_row, Delta + stat_row,
                                      Nq - row0, row0, n0, full_row, causal_offset, Nk, qk_scale, bh,
                                      ModArgs, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, SCORE_MOD, VARLEN,
                                      DQ_FIRST)
                ds = ds_smem.index(buf + WG)
            if DQ_SPLIT:   # this consumer's half of dQ's columns, from both consumers' dS and K
                # the previous step's reduce has read dq_smem (it had a whole step): waited here,
                # the barrier below tells the other threads too, and none is needed before the store
                tma.store_wait(0)
                gl.thread_barrier()              # every thread's dS stored (and fenced) ...
                mbarrier.arrive(ds_ready)        # ... before the other consumer may read it
                mbarrier.wait(ds_ready, t & 1)   # and the other's stored
                dq = gl.zeros([BLOCK_M, DQ_N], gl.float32, dq_layout)
                for w in gl.static_range(2):
                    k_cols = k_smem.index(w).reshape([BLOCK_N, HEAD_D]).slice(WG * DQ_N, DQ_N, dim=1)
                    dq = warpgroup_mma(ds_smem.index(buf + w), k_cols, dq, use_acc=w > 0, is_async=True)
                dk = warpgroup_mma(ds.permute((1, 0)), q_smem.index(s).reshape([BLOCK_M, HEAD_D]), dk,
                                   is_async=True)
                dv, dq = warpgroup_mma_wait(1, deps=(dv, dq))        # dK runs under dQ's store
                dq_smem.index(WG).reshape([BLOCK_M, DQ_N]).store(dq)
                fence_async_shared()
                _tma_reduce_add(dqa_desc, [tma_b, off_h, q_row0 + row0, WG * DQ_N], dq_smem.index(WG))
                dk = warpgroup_mma_wait(0, deps=(dk, ))
                mbarrier.arrive(empty.index(s))   # dK += dS^T Q was the stage's last reader
            else:
                if DQ_FIRST:   # dQ's first slice, then dK += dS^T Q: the slice's store and reduce below
                    # run while dK's wgmma does (wgmma groups complete in order: waiting for all but
                    # the last leaves dK in flight)
                    if DQ_TMA:   # the previous reduce has read dq_smem: waited before the barrier
                        tma.store_wait(0)   # that orders dS's stores before this wgmma, which
                        #                     then also tells the other threads
                    dq_first = warpgroup_mma(ds, k.slice(0, DQ_N, dim=1),
                                             gl.zeros([BLOCK_M, DQ_N], gl.float32, dq_layout),
                                             use_acc=False, is_async=True)
                    dk = warpgroup_mma(ds.permute((1, 0)), q_smem.index(s).reshape([BLOCK_M, HEAD_D]), dk,
                                       is_async=True)
                    dv, dq_first = warpgroup_mma_wait(1, deps=(dv, dq_first))
                else:
                    mbarrier.arrive(empty.index(s))   # dK += dS^T Q was the stage's last reader
                # dQ = dS K in column slices of DQ_N: an accumulator of BLOCK_M x DQ_N beside dK and
                # dV (all of D at once spilled at d128)
                for part in gl.static_range(HEAD_D // DQ_N):
                    if DQ_FIRST and part == 0:
                        dq = dq_first
                    else:
                        dq = warpgroup_mma(ds, k.slice(part * DQ_N, DQ_N, dim=1),
                                           gl.zeros([BLOCK_M, DQ_N], gl.float32, dq_layout),
                                           use_acc=False, is_async=True)
                        if DQ_FIRST:
                            dq, dk = warpgroup_mma_wait(0, deps=(dq, dk))
                        else:
                            dq = warpgroup_mma_wait(0, deps=(dq, ))
                    if DQ_TMA:   # through a (BLOCK_M, DQ_N) float32 buffer and a TMA reduce-add
                        # (VARLEN: rows past Nq add their zeros into the next sequence's)
                        if not (DQ_FIRST and part == 0):   # (waited above)
                            tma.store_wait(0)     # the previous reduce has read the buffer
                        dq_smem.index(WG).reshape([BLOCK_M, DQ_N]).store(dq)
                        fence_async_shared()
                        _tma_reduce_add(dqa_desc, [tma_b, off_h, q_row0 + row0, part * DQ_N],
                                        dq_smem.index(WG))
                    else:
                        rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
                        dcols = part * DQ_N + gl.arange(0, DQ_N, layout=gl.SliceLayout(0, dq_layout))
                        if VARLEN:   # dq_accum (1, Hq, total_q, D): Nq_pad = total_q rows a head
                            dq_head = DqAccum + (off_h.to(gl.int64) * Nq_pad + q_row0) * HEAD_D
                        else:
                            dq_head = DqAccum + bh.to(gl.int64) * Nq * HEAD_D
                        ptrs = dq_head + gl.expand_dims(rows * HEAD_D, 1) + gl.expand_dims(dcols, 0)
                        gl.atomic_add(ptrs, dq, mask=gl.expand_dims(rows < Nq, 1), sem="relaxed")
                if DQ_FIRST:
                    dk = warpgroup_mma_wait(0, deps=(dk, ))
                    mbarrier.arrive(empty.index(s))   # dK += dS^T Q was the stage's last reader
        if DQ_SPLIT:   # the other consumer's dQ read this one's K: its last wgmma done before dK
            mbarrier.arrive(ds_ready)           # overwrites the buffer
            mbarrier.wait(ds_ready, n_steps & 1)

        dk = (dk * scale).to(dtype)
        dv = dv.to(dtype)
        if VARLEN:
            if n0 + BLOCK_N > Nk:   # the sequence's last key block: the rows past Nk are the next
                # sequence's, which a TMA store (clipped only at the packed end) would overwrite
                kv_rows = (k_row0 + n0).to(gl.int64) * stride_dkm + off_hkv * stride_dkh
                _store_rows(dk, dK + kv_rows, stride_dkm, Nk - n0, BLOCK_N, HEAD_D, acc_layout)
                _store_rows(dv, dV + kv_rows, stride_dkm, Nk - n0, BLOCK_N, HEAD_D, acc_layout)
                tma.store_wait(0)   # the last dQ reduce has read its buffer before the CTA exits
            else:
                _store_dkdv(dk, dv, k_smem.index(WG), v_smem.index(WG), dk_desc, dv_desc,
                            [tma_b, off_hkv, k_row0 + n0, 0], BLOCK_N, HEAD_D)
        else:
            _store_dkdv(dk, dv, k_smem.index(WG), v_smem.index(WG), dk_desc, dv_desc,
                        [off_b, off_hkv, n0, 0], BLOCK_N, HEAD_D)

    @gluon.jit
    def _store_dkdv(dk, dv, k_view, v_view, dk_desc, dv_desc, coords, BLOCK_N: gl.constexpr,
                    HEAD_D: gl.constexpr):
        """dK, dV (BLOCK_N, HEAD_D) out through the K and V buffers (every wgmma reading them has
        completed) and TMA stores, which drop the rows past the descriptors' bounds (Nk dense)."""
        k_view.reshape([BLOCK_N, HEAD_D]).store(dk)
        v_view.reshape([BLOCK_N, HEAD_D]).store(dv)
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, coords, k_view)
        tma.async_copy_shared_to_global(dv_desc, coords, v_view)
        tma.store_wait(0)

    @gluon.jit
    def _store_rows(x, base, stride_m, n_rows, BLOCK: gl.constexpr, HEAD_D: gl.constexpr,
                    layout: gl.constexpr):
        """Rows [0, n_rows) of x (BLOCK, HEAD_D), in ``layout``, from registers into base's rows,
        stride_m elements apart (a masked store: TMA would write all BLOCK rows)."""
        rows = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, layout))
        ptrs = base + gl.expand_dims(rows.to(gl.int64) * stride_m, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, x, mask=gl.expand_dims(rows < n_rows, 1))

    # sizes are not specialised (on being 1 or multiples of 16): one compile per configuration.
    # stride_dkm and stride_dkh are (in practice Hkv x D and D, multiples of 16): known aligned,
    # the masked dK/dV stores move 4 bytes at a time, not 2
    @gluon.jit(do_not_specialize=["Hq", "Hkv", "Nq", "Nk", "Nq_pad", "GROUP"])
    def _fa3_bwd_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, Lse2, Delta,
                        DqAccum, ModArgs, CuSeqQ, CuSeqK, dK, dV, Hq, Hkv, Nq, Nk, Nq_pad, stride_dkm,
                        stride_dkh, scale, qk_scale, GROUP,
                        CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        HEAD_D: gl.constexpr, NUM_WG: gl.constexpr, STAGES: gl.constexpr,
                        DQ_TMA: gl.constexpr, KEYS_M: gl.constexpr, DQ_N: gl.constexpr,
                        CONSUMER_REGS: gl.constexpr, SCORE_MOD: gl.constexpr, VARLEN: gl.constexpr,
                        DQ_FIRST: gl.constexpr, DQ_SPLIT: gl.constexpr):
        # qk_scale: scale * log2(e) * the modifier's input_scale (dK and dQ take scale alone);
        # ModArgs, SCORE_MOD: the score modifier's per-(batch, query head) rows and function
        # VARLEN: packed sequences (Nq, Nk the longest's; descriptors over (1, H, total, D) views;
        # Lse2, Delta (Hq, total_q) and Nq_pad = total_q; dK, dV, stride_dkm, stride_dkh: where a
        # sequence's last key block is stored)
        # one flat grid axis: the key blocks of one (batch, kv head) adjacent; causal: the first
        # key blocks (seen by the most query rows) are the heaviest and go first
        CTA_N: gl.constexpr = BLOCK_N * NUM_WG
        n_n = gl.cdiv(Nk, CTA_N)
        pid_n = gl.program_id(0) % n_n
        off_bkv = gl.program_id(0) // n_n
        off_b = off_bkv // Hkv
        off_hkv = off_bkv % Hkv
        start_n = pid_n * CTA_N
        if VARLEN:   # past the last key block of this sequence (rows [cu_k[b], cu_k[b + 1]))
            if start_n >= gl.load(CuSeqK + off_b + 1) - gl.load(CuSeqK + off_b):
                return
        # VARLEN: Nq and Nk are the longest sequence's; the partitions take their sequence's
        m_lo, n_mb, n_steps = _steps(Nq, Nk, start_n, GROUP, BLOCK_M, CAUSAL)

        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_WG] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_WG] + v_desc.block_type.shape, v_desc.layout)
        if KEYS_M:   # dS^T (keys, rows); P^T stays in registers
            ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
            ds_smem = gl.allocate_shared_memory(dtype, [NUM_WG, BLOCK_N, BLOCK_M], ds_layout)
            p_smem = ds_smem     # unused
        else:        # dS and P (rows, keys)
            ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)
            ds_smem = gl.allocate_shared_memory(dtype, [NUM_WG * (2 if DQ_SPLIT else 1), BLOCK_M, BLOCK_N],
                                                ds_layout)
            p_smem = gl.allocate_shared_memory(dtype, [NUM_WG, BLOCK_M, BLOCK_N], ds_layout)
        if DQ_TMA:
            dq_smem = gl.allocate_shared_memory(gl.float32, [NUM_WG] + dqa_desc.block_type.shape,
                                                dqa_desc.layout)
        else:
            dq_smem = ds_smem        # unused
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)                       # the producer's expect + TMA bytes
        mbarrier.init(ds_ready, count=NUM_WG)                # DQ_SPLIT: each consumer's dS stored
        for i in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=NUM_WG)      # one arrival per consumer
        fence_async_shared()   # the inits visible to the TMA engine before its first load (see fa3_fwd)

        # constexprs written out in each call so that they stay constexprs (see fa3_fwd)
        if NUM_WG == 1:
            gl.warp_specialize([
                (_consumer, (dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem, ds_smem,
                             p_smem, dq_smem, kv_bar, q_ready, do_ready, empty, ds_ready, Lse2, Delta, DqAccum,
                             dK, dV, off_b, off_hkv, start_n, m_lo, n_mb, n_steps, GROUP, Hq, Nq, Nk,
                             Nq_pad, scale, qk_scale, ModArgs, CuSeqQ, CuSeqK, stride_dkm, stride_dkh,
                             0, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL, DQ_TMA, KEYS_M, DQ_N,
                             SCORE_MOD, VARLEN, DQ_FIRST, DQ_SPLIT)),
                (_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar,
                             q_ready, do_ready, empty, off_b, off_hkv, start_n, m_lo, n_mb, n_steps,
                             GROUP, CuSeqQ, CuSeqK, BLOCK_M, BLOCK_N, NUM_WG, STAGES, CAUSAL, VARLEN)),
            ], [1], [24])
        else:
            gl.static_assert(NUM_WG == 2, "1 or 2 consumer warpgroups")
            gl.static_assert(not DQ_SPLIT or (DQ_TMA and not KEYS_M), "dQ split: rows along M, TMA reduce")
            gl.warp_specialize([
                (_consumer, (dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem, ds_smem,
                             p_smem, dq_smem, kv_bar, q_ready, do_ready, empty, ds_ready, Lse2, Delta, DqAccum,
                             dK, dV, off_b, off_hkv, start_n, m_lo, n_mb, n_steps, GROUP, Hq, Nq, Nk,
                             Nq_pad, scale, qk_scale, ModArgs, CuSeqQ, CuSeqK, stride_dkm, stride_dkh,
                             0, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL, DQ_TMA, KEYS_M, DQ_N,
                             SCORE_MOD, VARLEN, DQ_FIRST, DQ_SPLIT)),
                (_consumer, (dk_desc, dv_desc, dqa_desc, q_smem, do_smem, k_smem, v_smem, ds_smem,
                             p_smem, dq_smem, kv_bar, q_ready, do_ready, empty, ds_ready, Lse2, Delta, DqAccum,
                             dK, dV, off_b, off_hkv, start_n, m_lo, n_mb, n_steps, GROUP, Hq, Nq, Nk,
                             Nq_pad, scale, qk_scale, ModArgs, CuSeqQ, CuSeqK, stride_dkm, stride_dkh,
                             1, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL, DQ_TMA, KEYS_M, DQ_N,
                             SCORE_MOD, VARLEN, DQ_FIRST, DQ_SPLIT)),
                (_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar,
                             q_ready, do_ready, empty, off_b, off_hkv, start_n, m_lo, n_mb, n_steps,
                             GROUP, CuSeqQ, CuSeqK, BLOCK_M, BLOCK_N, NUM_WG, STAGES, CAUSAL, VARLEN)),
            ], [4, 1], [CONSUMER_REGS, 24])


def supported(q, k, v, out=None, lse=None, dout=None, packed=False) -> bool:
    """Whether ``fa3_backward`` can run these inputs: where ``fa3_fwd.supported`` holds (sm90,
    Gluon 3.6, float16/bfloat16, head dim 64 or 128, q/k/v TMA-ready), with out and dout of q's
    shape and lse of (B, Hq, Nq) when given (dout is copied when it is not TMA-ready). Otherwise
    use ``fa2_backward``. packed: packed sequences, q (total_q, Hq, D), lse (Hq, total_q), asked
    about as ``fa3_fwd.supported(..., packed=True)`` does."""
    for t in (out, dout):
        if t is not None and (not isinstance(t, torch.Tensor) or t.shape != q.shape):
            return False
    lse_shape = q.shape[1:2] + q.shape[:1] if packed else q.shape[:3]
    if lse is not None and (not isinstance(lse, torch.Tensor) or lse.shape != lse_shape):
        return False
    return _GLUON and fa3_fwd.supported(q, k, v, packed=packed)


def fa3_backward(q, k, v, out, lse, dout, *, causal=False, scale=None, variant=None, score_mod=None,
                 cu_seqlens=None, max_seqlen=None, options=None):
    """Gradients of attention from the saved (q, k, v, out, lse), as ``fa2_backward``.

    q, out, dout: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D), float16/bfloat16, D in (64, 128), on an
    sm90 GPU (check ``supported`` first); lse (B, Hq, Nq) float32 natural log (-inf: a row with no
    key). Returns ``(dq, dk, dv)`` in q's dtype; dk, dv summed over each group of query heads.
    variant: a key of ``VARIANTS`` (default ``DEFAULT_VARIANT[D]``, ``DEFAULT_VARIANT_MODIFIED[D]``
    with a modifier). score_mod: the forward's ``kernels.score_mod.ScoreMod``
    (softcap, ALiBi), None: the scores as they are.
    cu_seqlens=(cu_q, cu_k), max_seqlen=(max_q, max_k): packed sequences as ``fa3_forward`` takes
    them, q, out, dout (total_q, Hq, D), k, v (total_k, Hkv, D), lse (Hq, total_q); dq, dk, dv
    packed like q, k, v (check ``supported(..., packed=True)``). options: a ``runtime.KernelOptions``
    (None: those in force; its ``fa3_dq_before_dk`` and ``fa3_smem_bytes``).
    """
    options = runtime.OPTIONS if options is None else options
    tensors = (q, k, v, out, lse, dout)
    mod_args, mod_fn, input_scale = score_mod_args(score_mod, None)
    packed = () if cu_seqlens is None else tuple(cu_seqlens)
    max_seqlen = None if max_seqlen is None else tuple(max_seqlen)   # a plan key's part
    pointers = tensors + packed + (() if mod_args is None else (mod_args, ))
    all_tensors = all(isinstance(t, torch.Tensor) for t in pointers)
    extra = (causal, scale, variant, mod_fn, input_scale, max_seqlen)
    key = plan_key(pointers, extra, options) if all_tensors else None
    plan = _plans.get(key)
    if plan is not None:   # a call like an earlier one: allocate and replay its launches (launch.py)
        return _replay(plan, q, k, v, out, lse, dout, mod_args, packed)
    if not supported(q, k, v, out, lse, dout, packed=bool(packed)):
        raise ValueError("fa3_backward: unsupported inputs (see fa3_bwd.supported); use fa2_backward")

    def as4(t):   # what the kernels see: packed (total, H, D) as (1, H, total, D)
        return fa3_fwd.packed_view(t) if packed else t
    D = q.shape[-1]
    scale = resolve_scale(scale, D)
    plannable = dout.dtype == q.dtype and tma_ok(as4(dout)) and out.stride(-1) == 1   # no copies
    dout = dout.to(q.dtype)
    if not tma_ok(as4(dout)):        # e.g. the expanded (stride 0) gradient of a sum
        dout = dout.contiguous()
        if not tma_ok(as4(dout)):
            dout = dout.clone()
    if out.stride(-1) != 1:
        out = out.contiguous()
    # laid out as ops._fake_grads says (torch.compile relies on it): like the inputs; packed dK
    # and dV share their strides (the kernel's masked stores take one pair)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    dense_kv = not (tma_ok(as4(dk)) and tma_ok(as4(dv))) or (bool(packed)
                                                                and dk.stride() != dv.stride())
    if dense_kv:
        dk, dv = torch.empty(k.shape, dtype=k.dtype, device=k.device), torch.empty_like(dk)
    q4, k4, v4, out4, dout4, dq4, dk4, dv4 = (as4(t) for t in (q, k, v, out, dout, dq, dk, dv))
    (Hq, rows_q), (Hkv, rows_k) = q4.shape[1:3], k4.shape[1:3]   # rows: packed, the totals
    if packed:   # the kernels' Nq, Nk: the longest sequence's
        (Nq, Nk), B = max_seqlen, packed[0].numel() - 1
    else:
        B, Nq, Nk = q.shape[0], rows_q, rows_k
    if B * Hq == 0 or 0 in (Nq, Nk, rows_q, rows_k):
        return dq.zero_(), dk.zero_(), dv.zero_()
    variant = variant or (DEFAULT_VARIANT if mod_fn is _identity else DEFAULT_VARIANT_MODIFIED)[D]
    config = kernel_config(variant, D, smem_bytes=options.fa3_smem_bytes, dq_before_dk=options.fa3_dq_before_dk)
    BM = config["BLOCK_M"]
    # lse2, delta rows per (batch, head): dense padded to whole query blocks (lse +inf, delta 0);
    # packed the total, rows past a sequence's end masked by the kernel
    nq_pad = rows_q if packed else -(-Nq // BM) * BM
    lse2 = torch.empty((q4.shape[0] * Hq, nq_pad), dtype=torch.float32, device=q.device)
    delta = torch.empty_like(lse2)
    lse = lse.contiguous()           # (B, Hq, Nq), or packed (Hq, total_q): (1 * Hq, total_q)
    rows = 64
    preprocess = fast_launch(_preprocess_kernel, (-(-nq_pad // rows), q4.shape[0] * Hq),
                             out4, dout4, lse, lse2, delta, *out4.stride()[:3], *dout4.stride()[:3], Hq,
                             rows_q, nq_pad, HEAD_D=D, ROWS=rows, num_warps=4,
                             kernel_options=options)
    dq_accum = torch.zeros(q4.shape, dtype=torch.float32, device=q.device)   # packed (1, Hq, total_q, D)
    block_q = (1, 1, BM, D)
    block_k = (1, 1, config["BLOCK_N"], D)
    block_dq = (1, 1, BM, config["DQ_N"])
    descs = (descriptor(q4, block_q), descriptor(dout4, block_q), descriptor(k4, block_k),
             descriptor(v4, block_k), descriptor(dk4, block_k), descriptor(dv4, block_k),
             descriptor(dq_accum, block_dq))
    cta_n = config["BLOCK_N"] * config["NUM_WG"]
    grid = (-(-Nk // cta_n) * B * Hkv,)
    # the identity's args and the dense kernel's offsets are never read: lse2 stands in; the
    # softcap's 1 / c joins the scores' scale only (dK and dQ take the softmax scale alone)
    main = fast_launch(_fa3_bwd_kernel, grid, *descs, lse2, delta, dq_accum,
                       lse2 if mod_args is None else mod_args, *(packed or (lse2, lse2)), dk4, dv4,
                       Hq, Hkv, Nq, Nk, nq_pad, dk4.stride(2), dk4.stride(1), scale,
                       scale * LOG2E * input_scale, Hq // Hkv, CAUSAL=bool(causal), SCORE_MOD=mod_fn,
                       VARLEN=bool(packed), **config, **launch_options(variant),
                       kernel_options=options)
    convert = fast_launch(_convert_dq_kernel, (-(-rows_q // rows), q4.shape[0] * Hq), dq_accum, dq4,
                          *dq4.stride()[:3], Hq, rows_q, scale, HEAD_D=D, ROWS=rows, num_warps=4,
                          kernel_options=options)
    if plannable:
        remember(_plans, key, (preprocess, main, convert, dense_kv, (lse2.shape, dq_accum.shape),
                               tuple(Descriptor.view(d) for d in descs)))
    return dq, dk, dv


_plans = {}   # launch.plan_key -> (its three Launches, dk/dv made dense?, lse2's and dq_accum's shapes,
#               descriptor views)


def _replay(plan, q, k, v, out, lse, dout, mod_args, packed):
    """fa3_backward's launches again, on new tensors laid out as the plan's (its key says so);
    mod_args: the score modifier's, None for the identity; packed: (cu_q, cu_k) or ()."""
    preprocess, main, convert, dense_kv, (lse2_shape, dq_accum_shape), views = plan
    dq = torch.empty_like(q)
    if dense_kv:
        dk, dv = (torch.empty(k.shape, dtype=k.dtype, device=k.device) for _ in range(2))
    else:
        dk, dv = torch.empty_like(k), torch.empty_like(v)
    lse2 = torch.empty(lse2_shape, dtype=torch.float32, device=q.device)
    delta = torch.empty_like(lse2)
    lse = lse.contiguous()
    preprocess(out, dout, lse, lse2, delta)
    dq_accum = torch.zeros(dq_accum_shape, dtype=torch.float32, device=q.device)
    # a descriptor's base is read for its address only: packed tensors stand for their views
    main(*(Descriptor(t, *view) for t, view in zip((q, dout, k, v, dk, dv, dq_accum), views)),
         lse2, delta, dq_accum, lse2 if mod_args is None else mod_args, *(packed or (lse2, lse2)),
         dk, dv)
    convert(dq_accum, dq)
    return dq, dk, dv
