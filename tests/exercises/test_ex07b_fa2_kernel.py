"""Grader of exercise 07b (lesson 07): the whole FA2 forward kernel ``fa2_kernel``.

The grader launches the learner's ``@triton.jit`` kernel itself (its own launcher below, the
stub's grid and arguments; the learner's ``attention_forward`` is not used, so it cannot stand in
for the kernel), from inside a harness kernel of its own that calls the learner's function as
Triton code in every program and then marks the program as run (so what runs is the function's
body, not whatever the kernel object's ``run`` was replaced by, such as a torch one-liner behind
``kernel[grid]``; a launch whose programs did not all run fails), through Triton's interpreter on
a CPU, with 64 x 64 blocks, on irregular shapes:
Nq != Nk, N not a multiple of the block, head dim 80 (padded to 128), several batches and heads,
grouped heads, K/V/out laid out differently from Q, causal on and off (bottom-right; Nq > Nk
gives rows with no key: out 0, lse -inf), rows with large logits, float32 and float16. Results
are compared with ``attention_ref`` (float64) under flashlib.testing's rule (baseline: textbook
attention in the same dtype, and for the GPU check flashlib's own FA2 kernel; through the
interpreter the floor from the inputs leaves a right kernel a margin of 8 or more, and running
flashlib's kernel there too would double the grader's time).

Every tensor is a view into a larger buffer filled with NaN: a load without its mask (rows past
N, head dims past D) reads NaN, deterministically and inside the buffer; a store without its
mask writes where the grader sees it. The inputs must come back unchanged. A load whose NaN is
thrown away (K rows past Nk whose scores become -inf, Q rows past Nq that are never stored)
leaves the results right: one check records, through the interpreter, the address of every
element each load reads and fails on any outside q, k and v (not under ``flashlib grade``, whose
student process runs the kernel).

Then the cases the 64 x 64 launch cannot tell apart: other block sizes (BLOCK_M = 32 over
BLOCK_N = 16, causal, and 16 over 128: BLOCK_M and BLOCK_N swapped in a bound or an advance),
rows whose scores all lie near -30000 (a running max started at 0 or -1e4 makes them empty), and
non-causal attention with more queries than keys (every row sees every key).

int32 offsets: one check gives the tensors a batch stride of 2**31 - 2**20 elements in a
3-batch tensor, so batch 2 starts past 2**31 elements: ``off_b * stride_qb`` in int32 wraps round
(to a place inside the buffer: no crash), then the same head stride in a 3-head tensor (``off_h *
stride_qh``). Each buffer is a 8.6 GB anonymous mapping of which only the touched pages are ever
allocated (Linux, MAP_NORESERVE). Where that cannot be had (no such mapping, or ``flashlib
grade``, whose student process receives copies of the tensors) the check falls back to running
the same shapes at small strides and reading the kernel's source for an int64 cast, and says so.

Probes name the mistake: top-left causal, a missing tail or head-dim mask, lse in base 2, a
tensor's strides mixed up with another's, a pointer not advanced, the loop stopping early, NaN on
rows with no key, out not normalised, batch/head/group offsets, int32 offsets, block sizes mixed
up, a running max not started at -inf, the causal empty-row rule applied without causal, loads
outside the tensors. Through the interpreter the whole grader takes a few seconds.
"""
import contextlib
import inspect
import math
import mmap
import sys
import types

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashlib.course import checks, grading
from flashlib import runtime
from flashlib.kernels.fa2_fwd import fa2_forward
from flashlib.kernels.tile import LOG2E
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex07b
# flashlib's own answers, removed from the copy of flashlib that `flashlib grade` shows the learner
# (a call from the learner's file while graded is "not accepted"): its FA2 forward kernel and the
# pieces it is built of (the key loop, one key tile, the final normalisation and stores). The
# pieces are named through modules that import them, decode and block_sparse: the copy removes
# them from fa2_fwd.py, where they are defined, while the tripwire (in-process grading) swaps them
# only in those modules, so flashlib's FA2 kernel, the GPU check's baseline, keeps its own.
FLASHLIB_ANSWERS = ("flashlib.kernels.fa2_fwd._fa2_fwd_kernel",
                    "flashlib.kernels.decode.attend_key_blocks",
                    "flashlib.kernels.block_sparse.attend_tile",
                    "flashlib.kernels.block_sparse.write_output")

DEV = runtime.DEVICE
BM = BN = 64
LN2 = math.log(2.0)

HINT_TOP_LEFT = ("causal here is bottom-right aligned: query i sees key j iff j <= i + Nk - Nq "
                 "(the last query sees every key; with Nq > Nk the first Nq - Nk see none). Your "
                 "mask is top-left (j <= i, SDPA's is_causal), which differs when Nq != Nk; the "
                 "loop's end too: hi = min(Nk, max(0, (pid_m + 1) * BLOCK_M + Nk - Nq))")
HINT_CAUSAL = ("causal is wrong although non-causal is right: scores of keys j > i + Nk - Nq "
               "are -inf (bottom-right), and the loop must still reach every key a row of the "
               "block sees: hi = min(Nk, max(0, (pid_m + 1) * BLOCK_M + Nk - Nq))")
HINT_CAUSAL_BOUND = ("causal misses one key block: the loop's end hi is exclusive. The last row of "
                     "query block pid_m is (pid_m + 1) * BLOCK_M - 1 and sees keys up to that "
                     "row + Nk - Nq, so hi = min(Nk, max(0, (pid_m + 1) * BLOCK_M + Nk - Nq)), "
                     "not one less: when that last key starts a key block, hi - 1 skips the block")
HINT_TAIL = ("keys past Nk are read: when Nk is not a multiple of BLOCK_N the last key block runs "
             "past the end of K and V. Load them with mask cols < Nk (other=0.0) and set the "
             "scores of those columns to -inf")
HINT_HEAD_DIM = ("the padded head dims are read: with D = 80, BLOCK_D = 128 and lanes 80-127 lie "
                 "past each row. Mask offs_d < D on every load (other=0.0) and on the store")
HINT_QUERY_ROWS = ("query rows past Nq: load Q with mask offs_m < Nq (and dims < D), store out "
                   "with mask (offs_m[:, None] < Nq) & (offs_d[None, :] < D) and lse with "
                   "offs_m < Nq; nothing past the tensors may be written")
HINT_LSE_BASE2 = ("lse must be in natural log: m_i and l_i are in base 2 (exp2 of scores scaled "
                  "by log2(e)), so lse = (m_i + log2(l_i)) * ln(2); m_i + log2(l_i) is the "
                  "base-2 log of the sum")
HINT_NORMALISE = ("out is off by a factor on each row: divide acc by l_i once, after the loop "
                  "(out = acc / l_i[:, None]); tile_update keeps acc unnormalised")
HINT_STRIDE = ("each tensor has its own strides: K's batches, heads and rows are stride_kb, "
               "stride_kh, stride_kn apart (V and Out likewise with theirs); yours is right when "
               "all tensors share Q's layout but not when K, V or Out are laid out differently")
HINT_OFFSETS = ("batch and head offsets: program (pid_m, bh) owns batch bh // Hq and query head "
                "bh % Hq (tl.program_id(1)); Q starts at Q + b * stride_qb + h * stride_qh, and "
                "lse at Lse + bh * Nq")
HINT_GQA = ("grouped heads: query head h reads K/V head h // GROUP (GROUP query heads share one "
            "K/V head), at K + b * stride_kb + (h // GROUP) * stride_kh")
HINT_INT64 = ("offsets overflow int32: program ids and strides are int32, and b * stride_qb "
              "(or h * stride_qh) passes 2**31 elements at large batch x heads x seqlen x "
              "headdim, where the product wraps round to a wrong address. Do the batch and head "
              "offsets in int64: off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * "
              "stride_qh (for Q, K, V and Out, and the K/V head)")
HINT_ADVANCE = ("the {what} pointers are not advanced: step start_n must load keys start_n .. "
                "start_n + BLOCK_N - 1 of K and of V: move both by BLOCK_N * their row stride "
                "each iteration (or recompute them from start_n)")
HINT_LOOP_BOUND = ("the loop misses key blocks: run start_n over range(0, hi, BLOCK_N) with "
                   "hi = Nk (non-causal), so the last block, partial or not, is included")
HINT_EMPTY = ("rows with no visible key (causal with Nq > Nk) must give out 0 and lse -inf, not "
              "NaN: l_i is 0 there, so divide by tl.where(l_i == 0, 1.0, l_i) and set lse to "
              "-inf where l_i == 0")
HINT_READS = ("every load is masked, even one whose values are thrown away later (scores set to "
              "-inf, rows never stored): the load itself reads memory that is not the tensor's, "
              "on a GPU past the end of its allocation (an illegal address) or another tensor's "
              "data. Load Q with (offs_m[:, None] < Nq) & (offs_d[None, :] < D), K and V with "
              "cols < Nk and offs_d < D (other=0.0)")
HINT_BLOCKS = ("right with 64 x 64 blocks only: BLOCK_M (query rows per program) and BLOCK_N (keys "
               "per step) are independent. Query rows are pid_m * BLOCK_M + arange(BLOCK_M), the "
               "causal end hi = min(Nk, max(0, (pid_m + 1) * BLOCK_M + Nk - Nq)) counts query "
               "rows, the K and V pointers move by BLOCK_N rows per step")
HINT_FAR_NEGATIVE = ("rows whose scores all lie far below 0 come out wrong: start the running max "
                     "at -inf (m_i = tl.full([BLOCK_M], float(\"-inf\"), tl.float32)), not at 0 "
                     "or a finite stand-in such as -1e4, and mask scores with -inf: a start above "
                     "every score makes every exp2(s - m) underflow to 0 (base 2: below -126) and "
                     "the row look empty")
HINT_NONCAUSAL_EMPTY = ("without causal every query sees every key, also when Nq > Nk: a row has no "
                        "key only with causal (bottom-right, the first Nq - Nk rows). Tell the "
                        "empty rows by l_i == 0 (or apply the position rule only when CAUSAL)")
HINT_LARGE = ("rows with large scores overflow: keep the max and the sum apart to the end, "
              "lse = (m_i + log2(l_i)) * ln(2), never log(exp2(m_i) * l_i), whose exp2 overflows "
              "float32 past 128")


# ---------------------------------------------------------------------------------------------
# the learner's kernel and the grader's launcher



def _kernel(impl):
    """The learner's fa2_kernel (``checks.jit_kernel``)."""
    return checks.jit_kernel(impl, "fa2_kernel", "ex07b", 28)


def _block_d(d):
    return max(16, triton.next_power_of_2(d))


@triton.jit
def _harness(Q, K, V, Out, Lse, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om, Hq, Nq, Nk, D,
             qk_scale, GROUP, Ran, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
             KERNEL: tl.constexpr):
    """The learner's kernel (KERNEL) called as Triton code, so that its body is what runs in this
    program; then the program marks its slot of Ran."""
    KERNEL(Q, K, V, Out, Lse, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
           stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om, Hq, Nq, Nk, D,
           qk_scale, GROUP, CAUSAL, BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION)
    tl.store(Ran + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), 1)


def _launch(kernel, q, k, v, out, lse, causal, scale=None, blocks=(BM, BN)):
    """The stub's launch: grid (cdiv(Nq, BLOCK_M), B * Hq), 64 x 64 blocks (or ``blocks``),
    ieee dots, through the harness; fails if a program of the grid did not run."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    block_m, block_n = blocks
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    ran = torch.zeros(math.prod(grid), dtype=torch.int32, device=DEV)
    _harness[grid](
        q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        Hq, Nq, Nk, D, scale * LOG2E, Hq // Hkv, ran, CAUSAL=bool(causal), BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=_block_d(D), DOT_PRECISION="ieee", num_warps=4, num_stages=1,
        KERNEL=kernel)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    checks.expect_every_program_ran(ran, "fa2_kernel", grid)


def _place(x, layout="bhnd"):
    """x (B, H, N, D) copied into a view of a NaN buffer: N padded by the largest block launched
    (128), D past BLOCK_D; the buffer's dims in ``layout`` order (e.g. "bnhd": heads inside
    rows). Returns (view, buf)."""
    B, H, N, D = x.shape
    sizes = dict(b=B, h=H, n=N + 128, d=_block_d(D) + 8)
    buf = torch.full([sizes[c] for c in layout], float("nan"), dtype=x.dtype, device=DEV)
    view = buf.permute(*[layout.index(c) for c in "bhnd"])[:, :, :N, :D]
    view.copy_(x)
    return view, buf


def _run(kernel, q, k, v, *, causal, layouts="bhnd bhnd bhnd bhnd", scale=None, blocks=(BM, BN),
         record=False):
    """Launch on q, k, v (B, H, N, D) tensors placed in NaN buffers. Returns a namespace with out
    (B, Hq, Nq, D) and lse as float64 CPU tensors, and what was written outside or changed; with
    ``record``, also ``stray``: the loads that read outside q, k and v (see _stray_loads)."""
    lq, lk, lv, lo = layouts.split()
    (qv, qb), (kv, kb), (vv, vb) = _place(q, lq), _place(k, lk), _place(v, lv)
    inputs = [b.clone() for b in (qb, kb, vb)]
    ov, ob = _place(torch.full_like(q, float("nan")), lo)
    B, Hq, Nq, _ = q.shape
    lse_buf = torch.full((B * Hq * Nq + BM,), float("nan"), dtype=torch.float32, device=DEV)
    lse = lse_buf[:B * Hq * Nq].view(B, Hq, Nq)
    with checks.loads_recorded() if record else contextlib.nullcontext() as loads:
        _launch(kernel, qv, kv, vv, ov, lse, causal, scale, blocks)
    stray = None if loads is None else _stray_loads(
        loads, [("Q", qv, qb, lq), ("K", kv, kb, lk), ("V", vv, vb, lv)])
    out = ov.detach().double().cpu()
    ob[tuple(slice(None) if c in "bh" else slice(0, q.shape[2] if c == "n" else q.shape[3])
             for c in lo)] = float("nan")                      # leaves what lies outside the view
    same = lambda a, b: torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())  # noqa: E731
    return types.SimpleNamespace(
        out=out, lse=lse.detach().double().cpu(), stray=stray,
        wrote_outside=bool((~torch.isnan(ob)).any() or (~torch.isnan(lse_buf[B * Hq * Nq:])).any()),
        changed_inputs=not all(same(a, b) for a, b in zip(inputs, (qb, kb, vb))))


def _stray_loads(loads, tensors):
    """What the recorded loads read outside the views: a list of phrases such as "K rows past Nk"
    (tensors: (name, view, buffer, layout) as placed by _place), empty when every load stayed
    inside q, k and v."""
    read = np.unique(np.concatenate(loads)) if loads else np.zeros(0, dtype=np.uint64)
    inside = np.concatenate([checks.element_addresses(view) for _, view, _, _ in tensors])
    stray, found = read[~np.isin(read, inside)], []
    for name, view, buf, layout in tensors:
        start, size = buf.data_ptr(), buf.element_size()
        mine = stray[(stray >= start) & (stray < start + buf.numel() * size)]
        if mine.size == 0:
            continue
        where = dict(zip(layout, np.unravel_index(((mine - start) // size).astype(np.int64),
                                                  tuple(buf.shape))))
        n, d = view.shape[2], view.shape[3]
        rows = "Nq" if name == "Q" else "Nk"
        if (where["n"] >= n).any():
            found.append(f"{name} rows past {rows} are loaded (rows "
                         f"{int(where['n'][where['n'] >= n].min())}..{int(where['n'].max())})")
        if (where["d"] >= d).any():
            found.append(f"{name} head dims past D are loaded (dims {d}..{int(where['d'].max())})")
        stray = stray[~np.isin(stray, mine)]
    if stray.size:
        found.append(f"{stray.size} elements outside the buffers of Q, K and V are loaded")
    return found


def _inputs(rng, shape_q, shape_kv, dtype=torch.float32, q_scale=1.0):
    q = q_scale * rng.standard_normal(shape_q)
    k, v = rng.standard_normal(shape_kv), rng.standard_normal(shape_kv)
    return tuple(torch.from_numpy(x).to(DEV, dtype) for x in (q, k, v))


def _close(a, b, tol=1e-3):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    same = (a == b) | (a - b).abs().le(tol * (1 + b.abs()))
    return bool(same.all())


# ---------------------------------------------------------------------------------------------
# probes: which mistake

def _probe(kernel, shape_q, shape_kv, *, causal=False, layouts="bhnd bhnd bhnd bhnd",
           same_blocks=None, seed=3):
    """Run a float32 case; True if out and lse match attention_ref (and nothing else was hit).
    same_blocks: "k" or "v": every key block of that tensor a copy of the first."""
    q, k, v = _inputs(np.random.default_rng(seed), shape_q, shape_kv)
    if same_blocks is not None:
        t = k if same_blocks == "k" else v
        t[:, :, BN:] = t[:, :, :BN].repeat(1, 1, t.shape[2] // BN - 1, 1)
    res = _run(kernel, q, k, v, causal=causal, layouts=layouts)
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    ok = _close(res.out, out_ref.cpu()) and _close(res.lse, lse_ref.cpu())
    return ok and not res.wrote_outside, res, (q, k, v, out_ref.cpu(), lse_ref.cpu())


def _explain(res, ref):
    """Mistakes visible on one result: lse in base 2, out not normalised, NaN on empty rows."""
    q, k, v, out_ref, lse_ref = ref
    empty = torch.isneginf(lse_ref)                                          # (B, H, Nq)
    if empty.any() and (res.out[empty].isnan().any() or res.lse[empty].isnan().any()):
        return HINT_EMPTY
    finite = ~empty
    if _close(res.lse[finite], lse_ref[finite] / LN2):
        return HINT_LSE_BASE2
    if _close(res.lse, lse_ref) and torch.isfinite(res.out).all():
        o, r = res.out[finite], out_ref[finite]                              # (rows, D)
        c = (o * r).sum(-1, keepdim=True) / (r * r).sum(-1, keepdim=True).clamp(min=1e-30)
        if _close(o, c * r) and not _close(c, torch.ones_like(c)):
            return HINT_NORMALISE
    return None


def _diagnose(kernel):
    """Name the likely mistake from small float32 probes (64 x 64 blocks), or None."""
    ok, res, ref = _probe(kernel, (1, 1, 64, 64), (1, 1, 64, 64))
    if not ok:
        return _explain(res, ref)
    ok, res, ref = _probe(kernel, (1, 1, 64, 64), (1, 1, 192, 64))
    if not ok:
        for what in ("v", "k"):
            if _probe(kernel, (1, 1, 64, 64), (1, 1, 192, 64), same_blocks=what)[0]:
                return HINT_ADVANCE.format(what=what.upper())
        q, k, v = ref[:3]
        if any(_close(res.out, attention_ref(q, k[:, :, :n], v[:, :, :n])[0].cpu()) for n in (64, 128)):
            return HINT_LOOP_BOUND
        return _explain(res, ref) or HINT_ADVANCE.format(what="K and V")
    if not _probe(kernel, (1, 1, 64, 64), (1, 1, 97, 64))[0]:
        return HINT_TAIL
    if not _probe(kernel, (1, 1, 64, 80), (1, 1, 64, 80))[0]:
        return HINT_HEAD_DIM
    ok, res, _ = _probe(kernel, (1, 1, 97, 64), (1, 1, 64, 64))
    if not ok:
        # without causal no row is empty; the first Nq - Nk = 33 given 0 and -inf: causal's rule
        return HINT_NONCAUSAL_EMPTY if torch.isneginf(res.lse[0, 0, :33]).all() else HINT_QUERY_ROWS
    if not _probe(kernel, (2, 3, 64, 64), (2, 3, 64, 64))[0]:
        return HINT_OFFSETS
    if not _probe(kernel, (1, 4, 64, 64), (1, 2, 64, 64))[0]:
        return HINT_GQA
    if not _probe(kernel, (2, 2, 64, 64), (2, 2, 64, 64), layouts="bhnd bnhd hbnd nbhd")[0]:
        return HINT_STRIDE
    ok, res, ref = _probe(kernel, (1, 1, 17, 64), (1, 1, 130, 64), causal=True)
    if not ok:
        q, k, v = ref[:3]
        top_left = torch.ones(17, 130, dtype=torch.bool).tril()
        if _close(res.out, attention_ref(q, k, v, mask=top_left)[0].cpu()):
            return HINT_TOP_LEFT
        return _explain(res, ref) or HINT_CAUSAL
    ok, res, ref = _probe(kernel, (1, 1, 130, 64), (1, 1, 33, 64), causal=True)
    if not ok:
        return _explain(res, ref) or HINT_CAUSAL
    ok, res, ref = _probe(kernel, (1, 1, 97, 64), (1, 1, 98, 64), causal=True)
    if not ok:
        return _explain(res, ref) or HINT_CAUSAL_BOUND
    return None


# ---------------------------------------------------------------------------------------------
# one case against the oracle

def _naive_lse(q, k, causal):
    """logsumexp of the scaled scores in float32 (the lse baseline), -inf on empty rows."""
    q, k = q.float(), k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5                 # (B, Hq, Nq, Nk)
    if causal:
        Nq, Nk = q.shape[-2], k.shape[-2]
        allowed = torch.arange(Nk, device=q.device) <= torch.arange(Nq, device=q.device)[:, None] + Nk - Nq
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.logsumexp(s, dim=-1)


def _expect(impl, rng, shape_q, shape_kv, *, causal, dtype=torch.float32, q_scale=1.0,
            layouts="bhnd bhnd bhnd bhnd", hint=None, blocks=(BM, BN), inputs=None, note="",
            record=False, library=False, explain=None):
    """Run the learner's kernel on one case and compare with the oracle. inputs: (q, k, v) to use
    instead of random ones; blocks: (BLOCK_M, BLOCK_N); note: words added to the case's name;
    record: also fail if a load read outside q, k or v; library: flashlib's own kernel as a second
    baseline, for the GPU, whose tensor cores round in their own way (through the interpreter,
    where dots are float32 loops like NumPy's, the floor from the inputs covers a right kernel
    with a margin of 5 or more, and the library's run would double the grader's time);
    explain(res, out_ref, lse_ref): a hint read off the result itself, tried before the probes
    (which rerun the kernel a dozen times). Returns the run's namespace."""
    kernel = _kernel(impl)
    q, k, v = _inputs(rng, shape_q, shape_kv, dtype, q_scale) if inputs is None else inputs
    what = (f"{str(dtype)[6:]} q {tuple(shape_q)}, k and v {tuple(shape_kv)}, causal={causal}"
            + ("" if layouts == "bhnd bhnd bhnd bhnd" else f", layouts q k v out: {layouts}")
            + ("" if blocks == (BM, BN) else f", BLOCK_M = {blocks[0]}, BLOCK_N = {blocks[1]}")
            + note)
    probes = hint or (lambda: _diagnose(kernel) or "follow the docstring step by step")
    diagnose = lambda: (explain and explain(res, out_ref.cpu(), lse_ref.cpu())) or probes()  # noqa: E731
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    res = _run(kernel, q, k, v, causal=causal, layouts=layouts, blocks=blocks, record=record)
    if res.changed_inputs:
        checks.fail(f"your kernel changed its inputs q, k or v ({what})", HINT_QUERY_ROWS)
    if res.wrote_outside:
        checks.fail(f"your kernel wrote outside out[:, :, :Nq, :D] or lse ({what})", diagnose())
    for name, got in (("out", res.out), ("lse", res.lse)):
        nan = torch.isnan(got)
        if nan.any():
            rows = (nan.any(-1) if nan.dim() == 4 else nan).nonzero()[:, -1].unique().tolist()
            checks.fail(f"{name} of {what} has NaN in query rows {rows[:8]}"
                        f"{' ...' if len(rows) > 8 else ''}", diagnose())
    out_lib, lse_lib = fa2_forward(q, k, v, causal=causal) if library else (None, None)
    mags = attention_magnitudes(q, k, v, causal=causal)
    baselines = [attention_naive(q, k, v, causal=causal).cpu()], [_naive_lse(q, k, causal).cpu()]
    if library:
        baselines[0].append(out_lib.cpu())
        baselines[1].append(lse_lib.cpu())
    checks.expect_close(res.out, out_ref.cpu(), name=f"out of {what}", dtype=dtype,
                        baseline=tuple(baselines[0]), hint=diagnose, magnitude=mags["out"])
    checks.expect_close(res.lse, lse_ref.cpu(), name=f"lse of {what}", dtype=torch.float32,
                        baseline=tuple(baselines[1]), hint=diagnose, magnitude=mags["lse"])
    if res.stray:
        checks.fail(f"out and lse are right, but your kernel reads outside q, k and v ({what}): "
                    + "; ".join(res.stray), HINT_READS)
    return res


# ---------------------------------------------------------------------------------------------
# the checks

def check_one_block(impl, rng):
    """one query block, one key block (64 x 64, head dim 64, float32)"""
    _expect(impl, rng, (1, 1, 64, 64), (1, 1, 64, 64), causal=False)


def check_ragged(impl, rng):
    """ragged lengths and a padded head dim: Nq = 97, Nk = 130, head dim 80, 2 heads"""
    _expect(impl, rng, (1, 2, 97, 80), (1, 2, 130, 80), causal=False)


def check_heads_and_layouts(impl, rng):
    """2 batches, 6 query heads over 2 K/V heads, K/V/out laid out unlike Q, float16"""
    _expect(impl, rng, (2, 6, 17, 80), (2, 2, 97, 80), causal=False, dtype=torch.float16,
            layouts="bhnd bnhd hbnd nbhd")


def check_causal(impl, rng):
    """causal, bottom-right: Nq < Nk, and Nq > Nk (rows with no key: out 0, lse -inf), and
    Nk = Nq + 1, where row 63's last key (64) starts a key block of its own"""
    _expect(impl, rng, (1, 2, 17, 80), (1, 2, 130, 80), causal=True)
    _expect(impl, rng, (1, 1, 97, 64), (1, 1, 98, 64), causal=True)
    # rows 0-96 see no key; query block 64-127 mixes empty rows and rows with keys
    _expect(impl, rng, (1, 3, 130, 80), (1, 1, 33, 80), causal=True, dtype=torch.float16)


def check_large_logits(impl, rng):
    """rows with large logits (scores in the hundreds: exp2 overflows float32 past 128)"""
    _expect(impl, rng, (1, 2, 33, 64), (1, 2, 97, 64), causal=False, q_scale=60.0,
            hint=lambda: _diagnose(_kernel(impl)) or HINT_LARGE)


@checks.not_under_grade   # loads are seen only where the kernel runs: this process's interpreter
def check_reads_inside(impl, rng):
    """every load stays inside q, k and v, even where its values would be thrown away
    (Nq = 33 and Nk = 70 end inside a block, head dim 40 in BLOCK_D = 64; through the interpreter)"""
    _expect(impl, rng, (1, 1, 33, 40), (1, 1, 70, 40), causal=False, record=True)


def check_other_blocks(impl, rng):
    """other block sizes: BLOCK_M = 32 with BLOCK_N = 16 (causal, Nq = 20, Nk = 36: the last
    rows see keys 32-35, a key block of their own), and BLOCK_M = 16 with BLOCK_N = 128 (Nq = 20,
    Nk = 150)"""
    kernel = _kernel(impl)
    for shape_q, shape_kv, causal, blocks in (((1, 1, 20, 32), (1, 1, 36, 32), True, (32, 16)),
                                             ((1, 1, 20, 32), (1, 1, 150, 32), False, (16, 128))):
        def hint(shape_q=shape_q, shape_kv=shape_kv, causal=causal):
            # the same case right with the harness's 64 x 64 blocks: the block sizes are mixed up
            ok = _probe(kernel, shape_q, shape_kv, causal=causal)[0]
            return HINT_BLOCKS if ok else (_diagnose(kernel) or HINT_BLOCKS)
        _expect(impl, rng, shape_q, shape_kv, causal=causal, blocks=blocks, hint=hint)


def _far_below_zero(rng, shape_q, shape_kv, score):
    """q, k, v whose scaled scores (scale 1/sqrt(D)) all lie near ``score`` (far below 0), a few
    units apart within a row and some tens between rows (float32)."""
    D = shape_q[-1]
    scale = D ** -0.5
    a = math.sqrt(-score / (scale * D))
    q = -a * (1 + 0.01 * rng.standard_normal(shape_q))
    k = a + 3 * rng.standard_normal(shape_kv) / (scale * a * math.sqrt(D))
    return tuple(torch.from_numpy(x).to(DEV, torch.float32)
                 for x in (q, k, rng.standard_normal(shape_kv)))


def check_far_negative_rows(impl, rng):
    """rows whose scores all lie far below 0 (near -30000, past exp2's range from 0)"""
    shape_q, shape_kv = (1, 1, 40, 32), (1, 1, 70, 32)
    kernel = _kernel(impl)
    _expect(impl, rng, shape_q, shape_kv, causal=False,
            inputs=_far_below_zero(rng, shape_q, shape_kv, -3e4), note=", every score near -30000",
            hint=lambda: _diagnose(kernel) or HINT_FAR_NEGATIVE,
            explain=lambda res, *_: HINT_FAR_NEGATIVE if torch.isneginf(res.lse).any() else None)


def check_more_queries_than_keys(impl, rng):
    """non-causal with more queries than keys (Nq = 70, Nk = 33): every row sees every key"""
    kernel = _kernel(impl)
    _expect(impl, rng, (1, 1, 70, 32), (1, 1, 33, 32), causal=False,
            hint=lambda: _diagnose(kernel) or HINT_NONCAUSAL_EMPTY,
            explain=lambda res, *_: HINT_NONCAUSAL_EMPTY if torch.isneginf(res.lse[..., :37]).all()
            or not res.out[..., :37, :].abs().sum() else None)


def _static_int64(impl, rng, kernel, why):
    """The fallback: the check's shapes at small strides, run (so that the point is not had from
    the source alone), then the source read for an int64 cast."""
    _expect(impl, rng, (3, 3, 16, 16), (3, 3, 16, 16), causal=False, dtype=torch.float16,
            note=", the int64 check's shapes at small strides")
    source = inspect.getsource(getattr(kernel, "fn", kernel))
    code = "\n".join(line.split("#")[0] for line in source.splitlines())
    if "int64" not in code:
        checks.fail(f"your kernel never computes an offset in int64 (read from its source: {why})",
                    HINT_INT64)


def _big_buffer(numel):
    """A float16 tensor of numel elements whose untouched pages cost nothing, or None."""
    if DEV.type == "cuda":
        try:
            return torch.empty(numel, dtype=torch.float16, device=DEV)
        except torch.cuda.OutOfMemoryError:
            return None
    if not sys.platform.startswith("linux"):
        return None
    try:
        area = mmap.mmap(-1, 2 * numel, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)
    except (OSError, ValueError):                          # 0x4000: MAP_NORESERVE on Linux
        return None
    return torch.frombuffer(area, dtype=torch.float16)


def check_int64_offsets(impl, rng):
    """a batch stride near 2**31 elements (3 batches), then a head stride near 2**31 (3 heads):
    batch and head offsets computed in int64"""
    kernel = _kernel(impl)
    if not isinstance(impl, types.ModuleType):
        return _static_int64(impl, rng, kernel, "graded in a separate process, which gets "
                                                "copies of the tensors, too large to copy here")
    N, D = 16, 16
    big = 2**31 - 2**20                 # an int32; 2 * big wraps to -2**21
    lead = 2**21 + 5 * N * D            # where a wrapped offset lands: inside the buffer
    for axis, (B, H), strides in (("batch", (3, 1), (big, N * D, D, 1)),
                                  ("head", (1, 3), (N * D, big, D, 1))):
        # q, k, v, out side by side (N * D apart), their batch or head 2 at 2 * big past them
        flat = _big_buffer(lead + 2 * big + 5 * N * D)
        if flat is None:
            return _static_int64(impl, rng, kernel,
                                 "no 8.6 GB address range to be had on this machine")
        q, k, v, out = (flat.as_strided((B, H, N, D), strides, lead + i * N * D) for i in range(4))
        data = _inputs(rng, (B, H, N, D), (B, H, N, D), torch.float16)
        for view, x in zip((q, k, v), data):
            view.copy_(x)
        out.fill_(float("nan"))
        lse = torch.full((B, H, N), float("nan"), device=DEV)
        _launch(kernel, q, k, v, out, lse, causal=False)
        out_ref, lse_ref = attention_ref(*data)
        wrong = sorted({(b, h) for b in range(B) for h in range(H)
                        if not (_close(out[b, h].double().cpu(), out_ref[b, h].cpu(), 2e-2)
                                and _close(lse[b, h].double().cpu(), lse_ref[b, h].cpu(), 1e-2))})
        far = [(b, h) for b in range(B) for h in range(H) if (b if axis == "batch" else h) == 2]
        if wrong == far:
            checks.fail(f"with a {axis} stride of {big} elements, {axis} 2 (which starts past "
                        f"2**31 elements) of out or lse is wrong; "
                        f"{ {'batch': 'batches', 'head': 'heads'}[axis]} 0 and 1 are right", HINT_INT64)
        if wrong:
            checks.fail(f"(batch, head) {wrong} of out or lse are wrong (float16, {B} batches of "
                        f"{H} heads of 16 x 16, a {axis} stride of {big} elements)",
                        _diagnose(kernel) or "follow the docstring step by step")
        del q, k, v, out, flat


CHECKS = [check_one_block, check_ragged, check_heads_and_layouts, check_causal,
          check_large_logits, check_int64_offsets, check_reads_inside, check_other_blocks,
          check_far_negative_rows, check_more_queries_than_keys]


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: your kernel, float16, Nq = 1000, Nk = 1100, head dim 80, causal
    (2 batches, 8 query heads over 2 K/V heads)"""
    _expect(impl, rng, (2, 8, 1000, 80), (2, 2, 1100, 80), causal=True, dtype=torch.float16,
            library=True)


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex07b(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex07b_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
