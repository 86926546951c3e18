"""Grader of exercise 10b (lesson 10): Flash-Decoding's split-KV kernel ``split_kv_kernel``.

The grader launches the learner's ``@triton.jit`` kernel itself (its own launcher below, the stub's
grid and arguments, the kernel called from a harness kernel of the grader's so that its body is what
runs in every program; the learner's ``split_kv_partials`` is not used), through Triton's
interpreter on a CPU, with 16-key blocks (32-key ones in one case: BLOCK_M = 16 rows against BLOCK_N
= 32 keys, and 20 rows in a tile of 32 against 16-key blocks in another, so a kernel that takes one
block size for the other is wrong one way or the other). The contract leaves the cut of [0, L) into
parts to the learner, so the checks judge what every right cut gives:

- the partition probe: V is the identity (v_j = e_j, head dim 64 = the cache's length), so a
  split's partial output shows which keys it attended (its nonzero lanes) and their weights.
  Lengths 0, 17 and 64 over 3 splits (empty splits, more splits than blocks, a full cache): the
  parts must be disjoint, cover [0, L), stay below L and share the work (none over
  cdiv(cdiv(L, S), BLOCK_N) * BLOCK_N keys), and each partial must be the softmax of scale * q.k
  over its own keys with its natural-log lse (0 and -inf when empty);
- merged results: the partials merged by their lse (exercise 10's combine, in float64 here)
  against ``attention_ref`` in float64 with the decode mask (j < L, bottom-right causal
  j <= i + L - Nq) under flashlib.testing's rule (baseline: textbook attention in the inputs'
  dtype; the terms' magnitudes computed only when the error is over the tolerance without them),
  on lengths 50 and 1 with 4 query heads over 2 K/V heads, head dim 40 (padded to 64), K and V
  laid out unlike Q, 4 splits, 32-key blocks; three new tokens in float16 (a sequence of 2, rows
  that see no key of a split), 2 splits; groups of 3 (three new tokens: 9 rows) and 4 (over 2 K/V
  heads, five new tokens: 20 rows); scores of 240 to 360 (keys planted along the query), 3
  splits.

Every tensor is a view into a larger buffer filled with NaN, and the stale cache positions (>= L)
are NaN too: a load without its mask reads NaN. OPart and LsePart start as NaN inside a NaN
buffer: a slot never written stays NaN, a store past them lands where the grader sees it. The
inputs must come back unchanged. A read whose value never reaches a store (a stale K position
whose score is masked, the tile's padding rows of Q) cannot show in the partials: in this process
(not under ``flashlib grade``) the interpreter's loads are recorded, and every address read must
lie inside Q's view, K's and V's valid positions (< L of each sequence) and Seqlens.

A failure is matched against plausible wrong answers (parts that overlap, skip keys, pass L or
take all the work; out not normalised, lse in base 2, exp of base-2 scores, no scale, grouped
heads interleaved, top-left or no causal mask) and small reruns with finite values where the NaN
were (stale positions or padded head dims loaded, a slot never written; else NaN of overflow, of
rows that see no key of a split, of empty splits), and the same case rerun with square blocks or
with K/V repeated to one head per query head (right where the case is wrong: the block sizes
confused, or the grouped heads), so the hint names the mistake. The probe and
the reruns use fixed inputs, run once per kernel. The whole grader takes about half a second.
"""
import contextlib
import functools
import math
import types

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashlib import runtime
from flashlib.course import checks, grading
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import attention_magnitudes, max_error, tolerance

pytestmark = pytest.mark.ex10b
# what a learner's file may use of flashlib (the stub's imports)
FLASHLIB_ALLOWED = ("flashlib", "flashlib.runtime", "flashlib.runtime.INTERPRET",
                    "flashlib.kernels.decode.combine")
# flashlib's own answer: calling it while graded is "not accepted"
FLASHLIB_ANSWERS = ("flashlib.kernels.decode.decode_partial",)

DEV = runtime.DEVICE
BLOCK_N = 16        # key block through the interpreter
LOG2E = math.log2(math.e)
N_PARAMS = 26
SENTINEL = -2.0 ** 100  # the reruns prefill the partials with it: a slot never written keeps it
PROBE_LENGTHS, PROBE_LMAX, PROBE_SPLITS = (0, 17, 64), 64, 3

HINT_SEQLENS = ("positions >= L were attended: mind cache_seqlens. Sequence b has L = Seqlens[b] "
                "valid positions (the rest, up to Lmax, is stale): load L = tl.load(Seqlens + b), "
                "b = bkv // Hkv, and cut [0, L) into the splits, not [0, Lmax)")
HINT_ALL_SPLITS = ("every split attended all the keys of its sequence: split s takes only its own "
                   "part of [0, L) (from tl.program_id(0)), so that the S parts are disjoint")
HINT_OVERLAP = ("splits overlap: a key attended by two splits counts twice in the merge. A part's "
                "last key block can run past the part's end: mask the loads and scores at the "
                "part's end (hi = min(its start + its length, L)), not at L")
HINT_SKIP = ("keys were attended by no split: the parts must cover [0, L) together, each key once. "
             "Round the part's length up, not down (cdiv, in whole key blocks)")
HINT_BALANCE = ("one split took more than its share: no part may hold more than cdiv(cdiv(L, S), "
                "BLOCK_N) * BLOCK_N keys. Each program attends only to its own part, chosen by "
                "split = tl.program_id(0)")
HINT_EMPTY = ("a split with no key to attend to (L = 0, past a short sequence's end, more splits "
              "than key blocks) must write out 0 and lse -inf, never NaN: its loop does not run, "
              "l = 0, and acc / l is 0 / 0. Divide by 1 where l = 0 (tl.where) and write -inf")
HINT_EMPTY_LSE = ("a split that attended no key writes lse = -inf (the log of an empty sum) and "
                  "out 0, so that its weight exp(lse_s - lse) in the merge is 0")
HINT_NORMALISE = ("the partial output must be normalised over the split's own keys: out = acc / l "
                  "once, after the loop; the merge weighs the splits by exp(lse_s - lse), which "
                  "assumes each one's weights sum to 1")
HINT_LSE_BASE2 = ("lse must be in natural log: a base-2 running max m and sum l (exp2 of scores "
                  "times log2(e)) give lse = (m + log2(l)) * ln(2); m + log2(l) is its base-2 log")
HINT_LSE = ("the partial outputs are right but lse is not: lse_s = ln(sum over the split's keys "
            "of exp(scale * q.k_j)); with a base-2 running max m and sum l, (m + log2(l)) * ln(2)")
HINT_SCALE = ("the scores miss the softmax scale: s = (q . k) * qk_scale, where qk_scale = scale * "
              "log2(e) (the launcher's), then exp2")
HINT_EXP_BASE = ("scores times qk_scale = scale * log2(e) are base 2: exponentiate them with exp2 "
                 "(tl.math.exp2), not exp")
HINT_STALE = ("NaN from stale cache positions: positions >= L hold stale data (NaN here) and must "
              "not be loaded. Mask the K and V loads with positions < the part's end (other=0.0): "
              "a -inf score alone is not enough, 0 * NaN is NaN in P @ V")
HINT_HEAD_DIM = ("the padded head dims are read: with D = 40, BLOCK_D = 64 and lanes 40-63 lie past "
                 "each row (NaN here). Mask offs_d < D on every load (other=0.0) and on the store")
HINT_UNWRITTEN = ("slots of OPart or LsePart were never written: every program writes its split's "
                  "slot [b, h, i, split] for every real row, an empty split too (out 0, lse -inf): "
                  "row (b * Hq + h) * Nq + i, slot row * num_splits + split, D floats per slot")
HINT_STORE = ("your kernel wrote outside its slots of OPart and LsePart: store with masks rows < "
              "GROUP * Nq and offs_d < D, at slot row * num_splits + split, D (not BLOCK_D) floats "
              "apart in OPart")
HINT_GQA = ("grouped heads: the GROUP query heads of K/V head hkv are hkv * GROUP + g, "
            "g = 0 .. GROUP - 1 (row r = g * Nq + i of the tile); yours reads or writes other heads")
HINT_TOP_LEFT = ("causal here is bottom-right aligned: the Nq new tokens are the last Nq of the L "
                 "positions, so token i sees position j iff j <= i + L - Nq; yours is top-left "
                 "(j <= i)")
HINT_NOT_CAUSAL = ("with Nq > 1 new tokens (speculative decoding), token i must not see the tokens "
                   "after it: it sees position j iff j <= i + L - Nq (bottom-right causal; with "
                   "Nq = 1, every valid key)")
HINT_CAUSAL = ("the new tokens' causal mask is wrong although one token per sequence is right: "
               "token i sees position j iff j <= i + L - Nq, and only keys of its split's part")
HINT_MASKED_ROWS = ("NaN on rows that see no key of a split: a new token whose diagonal ends before "
                    "the part starts sees none of its keys, so its running max stays -inf and "
                    "exp2(-inf - (-inf)) is NaN. Use 0 as the max where it is -inf (tl.where); "
                    "such a row writes 0 and -inf")
HINT_MAX = ("large scores overflow: exp2 of scores in the hundreds is inf in float32. Keep a "
            "running max m of each row's scores, exponentiate s - m, and rescale the running sum "
            "and acc by exp2(m_old - m_new) when it grows")
HINT_BLOCKS = ("right with BLOCK_M == BLOCK_N, wrong with other block sizes: the tile has BLOCK_M "
               "query rows (offs_r = tl.arange(0, BLOCK_M)) and each step of the key loop BLOCK_N "
               "keys (offs_n = tl.arange(0, BLOCK_N), the loop steps by BLOCK_N, a part is a "
               "multiple of BLOCK_N keys)")
HINT_READS = ("every load must stay inside its tensor and the valid cache, even one whose values "
              "never reach a store (a stale K position whose score is masked, a padding row of the "
              "tile): on a GPU such a read can fault, and stale positions may hold anything. Mask Q "
              "with rows < GROUP * Nq and dims < D, K and V with positions < hi (the part's end, "
              "<= L) and dims < D")
HINT_OFFSETS = ("batch, head and row offsets: program (split, bkv) owns batch bkv // Hkv and K/V "
                "head bkv % Hkv; K and V have their own strides, which may differ from Q's")


# ---------------------------------------------------------------------------------------------
# the learner's kernel, the grader's launcher, the cases

def _kernel(impl):
    """The learner's split_kv_kernel (``checks.jit_kernel``)."""
    return checks.jit_kernel(impl, "split_kv_kernel", "ex10b", N_PARAMS)


def _pow2(n):
    return max(16, triton.next_power_of_2(n))


def _place(x, layout, block, fill):
    """x (B, H, N, D) copied into a view of a buffer of ``fill``: N padded by a block, D past
    BLOCK_D; the buffer's dims in ``layout`` order (e.g. "bnhd"). Returns (view, buf)."""
    B, H, N, D = x.shape
    sizes = dict(b=B, h=H, n=N + block, d=_pow2(D) + 8)
    buf = torch.full([sizes[c] for c in layout], fill, dtype=x.dtype, device=DEV)
    view = buf.permute(*[layout.index(c) for c in "bhnd"])[:, :, :N, :D]
    view.copy_(x)
    return view, buf


def _flat(shape, fill, tail):
    """A contiguous float32 tensor of ``shape`` at the start of a NaN buffer ``tail`` longer."""
    n = math.prod(shape)
    buf = torch.full((n + tail,), float("nan"), dtype=torch.float32, device=DEV)
    buf[:n] = fill
    return buf[:n].view(shape), buf


@triton.jit
def _harness(Q, K, V, Seqlens, OPart, LsePart, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh,
             stride_kn, stride_vb, stride_vh, stride_vn, Hkv, Nq, Lmax, D, qk_scale, num_splits,
             GROUP, Ran, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             DOT_PRECISION: tl.constexpr, KERNEL: tl.constexpr):
    """The learner's kernel (KERNEL) called as Triton code, so that its body is what runs in this
    program (a torch one-liner behind ``kernel[grid]`` does not); then the program marks its
    slot of Ran."""
    KERNEL(Q, K, V, Seqlens, OPart, LsePart, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh,
           stride_kn, stride_vb, stride_vh, stride_vn, Hkv, Nq, Lmax, D, qk_scale, num_splits, GROUP,
           BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION)
    tl.store(Ran + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), 1)


def _run(kernel, c, *, nan_stale=True, nan_pad=True, block_n=BLOCK_N, record=False):
    """Launch the stub's grid (num_splits, B * Hkv) on case ``c``. nan_stale: positions >= L are
    NaN (else c's data); nan_pad: the buffers around the tensors are NaN (else 0). The partials
    start as NaN (as SENTINEL when neither is). Returns o (B, Hq, Nq, S, D) and lse (B, Hq, Nq, S)
    as float64 CPU tensors, whether anything was written past them and whether inputs changed;
    with ``record``, ``stray``: what the loads read outside the inputs (None where loads cannot
    be seen)."""
    pad = float("nan") if nan_pad else 0.0
    (q, qb), (k, kb), (v, vb) = (_place(t, lay, block_n, pad) for t, lay in
                                 ((c.q, "bhnd"), (c.k, c.k_layout), (c.v, c.v_layout)))
    if nan_stale:
        for b, L in enumerate(c.lengths):
            k[b, :, L:], v[b, :, L:] = float("nan"), float("nan")
    seqlens = torch.tensor(c.lengths, dtype=torch.int32, device=DEV)
    bufs = [qb, kb, vb, seqlens]
    inputs = [t.clone() for t in bufs]
    B, Hq, Nq, D = c.q.shape
    Hkv, Lmax = c.k.shape[1], c.k.shape[2]
    fill = float("nan") if (nan_stale or nan_pad) else SENTINEL
    # tails: room for slots BLOCK_D floats apart instead of D, and a block of rows more
    o, ob = _flat((B, Hq, Nq, c.S, D), fill, (B * Hq * Nq * c.S + 256) * _pow2(D))
    lse, lb = _flat((B, Hq, Nq, c.S), fill, 256 * c.S)
    ran = torch.zeros(c.S * B * Hkv, dtype=torch.int32, device=DEV)
    with checks.loads_recorded() if record else contextlib.nullcontext() as loads:
        _harness[(c.S, B * Hkv)](
            q, k, v, seqlens, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            Hkv, Nq, Lmax, D, LOG2E / math.sqrt(D), c.S, Hq // Hkv, ran, BLOCK_M=_pow2(Hq // Hkv * Nq),
            BLOCK_N=block_n, BLOCK_D=_pow2(D), DOT_PRECISION="ieee", num_warps=4, num_stages=1,
            KERNEL=kernel)
    stray = None if loads is None else _stray_loads(loads, c, q, (("K", k, kb), ("V", v, vb)),
                                                    seqlens)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    checks.expect_every_program_ran(ran, "split_kv_kernel", (c.S, B * Hkv))
    same = lambda a, b: torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())  # noqa: E731
    return types.SimpleNamespace(
        o=o.double().cpu(), lse=lse.double().cpu(), stray=stray,
        wrote_outside=bool((~torch.isnan(ob[o.numel():])).any() or (~torch.isnan(lb[lse.numel():])).any()),
        changed_inputs=not all(same(a, b) for a, b in zip(inputs, bufs)))


def _stray_loads(loads, c, q, caches, seqlens):
    """What the recorded loads read outside Q's view, the caches' valid positions (< L of each
    sequence) and Seqlens: a list of phrases, empty when every load stayed inside."""
    read = np.unique(np.concatenate(loads)) if loads else np.zeros(0, dtype=np.uint64)
    valid = [checks.element_addresses(q), checks.element_addresses(seqlens)]
    valid += [checks.element_addresses(view[b:b + 1, :, :L])
              for _, view, _ in caches for b, L in enumerate(c.lengths)]
    stray, found = read[~np.isin(read, np.concatenate(valid))], []
    for name, view, buf in caches:
        start, size = buf.data_ptr(), buf.element_size()
        mine = (stray >= start) & (stray < start + buf.numel() * size)
        if mine.any():
            found.append(f"{name} positions at or past L (or head dims past D) are loaded")
            stray = stray[~mine]
    if stray.size:
        found.append(f"{stray.size} elements outside Q's rows and dims, the caches and Seqlens "
                     "are loaded (Q rows past GROUP * Nq, or head dims past D)")
    return found


def _case(rng, lengths, heads, Nq, Lmax, D, S, *, dtype=torch.float32, q_scale=1.0,
          layouts="bhnd bhnd", identity_v=False):
    """Inputs (rounded to ``dtype``) and the decode mask (B, 1, Nq, Lmax): j < L, j <= i + L - Nq.
    q_scale > 1 (one query head per K/V head): each query has norm q_scale * sqrt(D), and key 5 of
    every 16 is its direction times 8 to 12: a score of 240 to 360, whose exp overflows float32."""
    Hq, Hkv = heads
    B = len(lengths)
    q = rng.standard_normal((B, Hq, Nq, D))
    k = rng.standard_normal((B, Hkv, Lmax, D))
    if q_scale != 1:
        q = q / np.linalg.norm(q, axis=-1, keepdims=True) * math.sqrt(D)
        alpha = rng.uniform(8.0, 12.0, (B, Hkv, len(range(5, Lmax, 16)), 1))
        k[:, :, 5::16] = alpha * q / math.sqrt(D)                           # score q_scale * alpha
    v = np.broadcast_to(np.eye(Lmax, D), (B, Hkv, Lmax, D)) if identity_v else \
        rng.standard_normal((B, Hkv, Lmax, D))
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x)).to(DEV, dtype) for x in (q_scale * q, k, v))
    L = torch.tensor(lengths, device=DEV)[:, None, None, None]
    i, j = torch.arange(Nq, device=DEV)[:, None], torch.arange(Lmax, device=DEV)[None, :]
    k_layout, v_layout = layouts.split()
    return types.SimpleNamespace(q=q, k=k, v=v, lengths=list(lengths), S=S, dtype=dtype,
                                 q_scale=q_scale, k_layout=k_layout, v_layout=v_layout,
                                 mask=(j < L) & (j <= i + L - Nq))


def _what(c):
    return (f"{str(c.dtype)[6:]}, lengths {c.lengths} of Lmax {c.k.shape[2]}, {c.q.shape[1]} query "
            f"heads over {c.k.shape[1]} K/V heads, Nq {c.q.shape[2]}, head dim {c.q.shape[3]}, "
            f"{c.S} splits" + (f", scores up to {12 * c.q_scale:g}" if c.q_scale != 1 else "")
            + ("" if c.k_layout == c.v_layout == "bhnd" else f", K/V laid out {c.k_layout}/{c.v_layout}"))


def _merge(o, lse):
    """Exercise 10's combine in float64: o (..., S, D), lse (..., S) -> out (..., D), lse (...)."""
    m = lse.max(-1, keepdim=True).values
    m = torch.where(m == -math.inf, 0.0, m)
    w = torch.exp(lse - m)                                                   # (..., S)
    total = w.sum(-1)
    out = (w[..., None] * o).sum(-2) / torch.where(total == 0, 1.0, total)[..., None]
    return out, torch.where(total == 0, -math.inf, m[..., 0] + torch.log(total))


def _close(a, b, tol=1e-3):
    a, b = (torch.as_tensor(t, dtype=torch.float64).cpu() for t in (a, b))
    return a.shape == b.shape and bool(((a == b) | (a - b).abs().le(tol * (1 + b.abs()))).all())


def _compare(out, lse, ref_out, ref_lse, base, magnitudes, dtype, what, hint):
    """out and lse against the oracle under flashlib.testing's rule. The terms' magnitudes
    (``magnitudes()``) are computed only when the error is over the tolerance without them: they
    can only raise the floor, so the verdict is the rule's either way."""
    for name, got, exp, baseline, dt in (("out", out, ref_out, base, dtype),
                                         ("lse", lse, ref_lse, ref_lse.float(), torch.float32)):
        if max_error(got, exp) > tolerance(exp, baseline, dt):
            checks.expect_close(got, exp, name=f"{name} {what}", dtype=dt, baseline=baseline,
                                hint=hint, magnitude=magnitudes()[name])


def _common(c, res, diagnose):
    """What every case checks of the partials: inputs unchanged, nothing written outside, no NaN
    or +inf, empty slots (lse -inf) with out 0."""
    what = _what(c)
    if res.changed_inputs:
        checks.fail(f"your kernel changed its inputs ({what})", "write only OPart and LsePart")
    if res.wrote_outside:
        checks.fail(f"your kernel wrote outside OPart or LsePart ({what})", HINT_STORE)
    bad = torch.isnan(res.o).any(-1) | torch.isnan(res.lse) | (res.lse == math.inf)
    if bad.any():
        b, h, i, s = bad.nonzero()[0].tolist()
        checks.fail(f"NaN or +inf in the partials of {what}: {int(bad.sum())} of {bad.numel()} "
                    f"slots, first at batch {b} (L = {c.lengths[b]}), head {h}, token {i}, "
                    f"split {s}", diagnose())
    wrong = (res.lse == -math.inf) & (res.o != 0).any(-1)
    if wrong.any():
        b, h, i, s = wrong.nonzero()[0].tolist()
        checks.fail(f"split {s} of batch {b} (L = {c.lengths[b]}), head {h}, token {i} wrote "
                    f"lse -inf but a nonzero out ({what})", HINT_EMPTY_LSE)


# ---------------------------------------------------------------------------------------------
# the partition probe: V = identity shows which keys each split attended, and their weights

def _partition_problem(c, res):
    """(message, hint) for the first problem with the parts the splits attended, or None."""
    S, Ls = c.S, c.lengths
    o, lse = res.o[:, 0, 0], res.lse[:, 0, 0]                                 # (B, S, D), (B, S)
    att = o != 0                                                              # (B, S, Lmax)
    keys = lambda js: f"{js[0]}" if len(js) == 1 else f"{js[0]} to {js[-1]} ({len(js)} keys)"  # noqa: E731
    for b, L in enumerate(Ls):
        for s in range(S):
            if lse[b, s] > -math.inf and not att[b, s].any():
                return (f"split {s} of sequence {b} (L = {L}) attended no key but wrote lse = "
                        f"{lse[b, s].item():.4g}", HINT_EMPTY_LSE)
            past = (att[b, s, L:].nonzero()[:, 0] + L).tolist()
            if past:
                return (f"split {s} of sequence {b} (L = {L}) attended positions {keys(past)}, "
                        "at or past L", HINT_SEQLENS)
    if all(att[b, :, :L].all() for b, L in enumerate(Ls)):
        return f"each of the {S} splits of every sequence attended all its keys", HINT_ALL_SPLITS
    if all(att[b].any(0).nonzero()[:, 0].tolist() == [0][:L] for b, L in enumerate(Ls)):
        return "only key 0 of each sequence was attended", HINT_TOP_LEFT
    for b, L in enumerate(Ls):
        count = att[b, :, :L].sum(0)                                          # (L,)
        twice, never = ((count > 1).nonzero()[:, 0].tolist(), (count == 0).nonzero()[:, 0].tolist())
        if twice:
            who = [s for s in range(S) if att[b, s, twice[0]]]
            return (f"sequence {b} (L = {L}): keys {keys(twice)} were attended by more than one "
                    f"split (key {twice[0]} by splits {who})", HINT_OVERLAP)
        if never:
            return f"sequence {b} (L = {L}): keys {keys(never)} were attended by no split", HINT_SKIP
        most = triton.cdiv(triton.cdiv(L, S), BLOCK_N) * BLOCK_N
        for s in range(S):
            if att[b, s].sum() > most:
                return (f"sequence {b} (L = {L}): split {s} attended {int(att[b, s].sum())} keys, "
                        f"more than {most} = cdiv(cdiv({L}, {S}), {BLOCK_N}) * {BLOCK_N}",
                        HINT_BALANCE)
    return None


def _probe(kernel, rng):
    """The partition probe on ``kernel``: raises CheckFailed with a hint, or returns None."""
    c = _case(rng, PROBE_LENGTHS, (1, 1), 1, PROBE_LMAX, PROBE_LMAX, PROBE_SPLITS, identity_v=True)
    res = _run(kernel, c, nan_stale=False)     # stale keys finite: attending them shows
    _common(c, res, lambda: _diagnose_nan(kernel, c, res))
    problem = _partition_problem(c, res)
    if problem is not None:
        checks.fail(*problem)
    # each split's expected result: the query's attention over the keys that split attended
    parts = (res.o[:, 0, 0] != 0).to(DEV)[:, None]                             # (B, 1, S, Lmax)
    q = c.q.expand(-1, -1, c.S, -1)                                           # (B, 1, S, D)
    ref = lambda s=None: [t.cpu() for t in attention_ref(q, c.k, c.v, mask=parts, scale=s)]  # noqa: E731
    ref_o, ref_lse = ref()
    o, lse = res.o[:, :, 0], res.lse[:, :, 0]                                 # (B, 1, S, D), (B, 1, S)

    def diagnose():
        sums = o.sum(-1)[lse > -math.inf]
        if not _close(sums, torch.ones_like(sums)):
            return HINT_NORMALISE
        scale = 1.0 / math.sqrt(c.q.shape[-1])
        for hint, s in ((HINT_SCALE, 1.0), (HINT_SCALE, math.log(2)), (HINT_EXP_BASE, scale * LOG2E)):
            if _close(o, ref(s)[0]):
                return hint
        if _close(o, ref_o):
            return HINT_LSE_BASE2 if _close(lse, ref_lse / math.log(2)) else HINT_LSE
        return None

    _compare(o, lse, ref_o, ref_lse, attention_naive(q, c.k, c.v, mask=parts).double().cpu(),
             functools.cache(lambda: attention_magnitudes(q, c.k, c.v, mask=parts)),
             torch.float32, f"of each split, lengths {c.lengths} (V the identity)", diagnose)


_memo = {}   # (what, id(kernel)) -> (kernel, hint or None): the diagnoses on fixed inputs


def _once(what, kernel, fn):
    """fn()'s hint for ``kernel``, computed once per kernel (fixed inputs: seed-independent)."""
    key = (what, id(kernel))
    if key not in _memo or _memo[key][0] is not kernel:
        _memo[key] = (kernel, fn())
    return _memo[key][1]


def _probe_hint(kernel):
    """The probe's hint (None if it passes): a later check that fails names it first."""
    def run():
        try:
            _probe(kernel, np.random.default_rng(5))
        except checks.CheckFailed as e:
            return str(e).partition("hint: ")[2] or None
        return None
    return _once("probe", kernel, run)


# ---------------------------------------------------------------------------------------------
# which mistake

def _nan_source(kernel):
    """HINT_UNWRITTEN, HINT_STALE, HINT_HEAD_DIM or None, from a small case with no empty split
    and no row without keys (20 of 32 positions, head dim 40, 2 splits) run with NaN nowhere (the
    partials prefilled with SENTINEL), then at the stale positions only, then around the tensors."""
    def run():
        c = _case(np.random.default_rng(5), (20,), (1, 1), 1, 32, 40, 2)
        nan = lambda r: bool(torch.isnan(r.o).any() or torch.isnan(r.lse).any())  # noqa: E731
        finite = _run(kernel, c, nan_stale=False, nan_pad=False)
        if (finite.o == SENTINEL).any() or (finite.lse == SENTINEL).any():
            return HINT_UNWRITTEN
        if nan(_run(kernel, c, nan_stale=True, nan_pad=False)):
            return HINT_STALE
        return HINT_HEAD_DIM if nan(_run(kernel, c, nan_stale=False, nan_pad=True)) else None
    return _once("nan", kernel, run)


def _diagnose_nan(kernel, c, res):
    """Why ``res`` of case ``c`` holds NaN: a load or store (``_nan_source``), else overflow
    (large scores), rows that see no key of a split (not on the last new token, which sees every
    key of its part), or empty splits."""
    hint = _nan_source(kernel) or _shape_probe(kernel, c)
    if hint is not None:
        return hint
    if c.q_scale > 1:
        return HINT_MAX
    bad = torch.isnan(res.o).any(-1) | torch.isnan(res.lse)                  # (B, Hq, Nq, S)
    return HINT_MASKED_ROWS if c.q.shape[2] > 1 and not bad[:, :, -1].any() else HINT_EMPTY


def _diagnose(kernel, c, res, out, lse, ref_out):
    """The likely mistake of ``res`` (merged: out, lse) on case ``c``, or None."""
    hint = _probe_hint(kernel)
    if hint is not None:
        return hint
    if torch.isnan(res.o).any() or torch.isnan(res.lse).any() or (res.lse == math.inf).any():
        return _diagnose_nan(kernel, c, res)
    B, Hq, Nq, D = c.q.shape
    Hkv, Lmax = c.k.shape[1], c.k.shape[2]
    L = torch.tensor(c.lengths, device=DEV)[:, None, None, None]
    i, j = torch.arange(Nq, device=DEV)[:, None], torch.arange(Lmax, device=DEV)[None, :]
    perm = [g * Hkv + h for h in range(Hkv) for g in range(Hq // Hkv)]      # heads interleaved
    ref = lambda q=c.q, mask=c.mask, s=None: attention_ref(q, c.k, c.v, mask=mask, scale=s)  # noqa: E731
    wrong = [(HINT_GQA, lambda: ref(q=c.q[:, perm])), (HINT_SCALE, lambda: ref(s=1.0)),
             (HINT_SCALE, lambda: ref(s=math.log(2))), (HINT_EXP_BASE, lambda: ref(s=LOG2E / D ** 0.5))]
    if Nq > 1:
        wrong += [(HINT_TOP_LEFT, lambda: ref(mask=(j < L) & (j <= i))),
                  (HINT_NOT_CAUSAL, lambda: ref(mask=(j < L) & (i >= 0)))]
    for hint, formula in wrong:
        w_out, w_lse = formula()
        if _close(out, w_out) and _close(lse, w_lse):
            return hint
    if _close(out, ref_out):
        return HINT_LSE
    hint = _shape_probe(kernel, c)
    if hint is not None:
        return hint
    if Nq > 1:
        return HINT_CAUSAL
    return HINT_OFFSETS if c.k_layout != "bhnd" or c.v_layout != "bhnd" else None


def _right(kernel, c, block_n):
    """Whether the kernel's merged result on case ``c`` is right (no NaN, close to the oracle)."""
    res = _run(kernel, c, block_n=block_n)
    out, lse = _merge(res.o, res.lse)
    ref_out, ref_lse = (t.cpu() for t in attention_ref(c.q, c.k, c.v, mask=c.mask))
    tol = 1e-3 if c.dtype == torch.float32 else 1e-2
    return not (torch.isnan(res.o).any() or torch.isnan(res.lse).any()) and \
        _close(out, ref_out, tol) and _close(lse, ref_lse, tol)


def _shape_probe(kernel, c):
    """HINT_BLOCKS if case ``c`` is right rerun with square blocks (BLOCK_N = BLOCK_M), HINT_GQA if
    right with K/V repeated to one head per query head; None otherwise."""
    B, Hq, Nq, D = c.q.shape
    G, block_n = Hq // c.k.shape[1], getattr(c, "block_n", BLOCK_N)
    if block_n != _pow2(G * Nq) and _right(kernel, c, _pow2(G * Nq)):
        return HINT_BLOCKS
    if G > 1:     # square blocks again (BLOCK_N = BLOCK_M of Nq rows): only the group changes
        one = types.SimpleNamespace(**{**vars(c), "k": c.k.repeat_interleave(G, 1),
                                       "v": c.v.repeat_interleave(G, 1)})
        if _right(kernel, one, _pow2(Nq)):
            return HINT_GQA
    return None


# ---------------------------------------------------------------------------------------------
# one case against the oracle, merged

def _expect(impl, rng, lengths, heads, Nq, Lmax, D, S, *, block_n=BLOCK_N, hint=None,
            record=False, **kwargs):
    kernel = _kernel(impl)
    c = _case(rng, lengths, heads, Nq, Lmax, D, S, **kwargs)
    c.block_n = block_n
    res = _run(kernel, c, block_n=block_n, record=record)
    out, lse = _merge(res.o, res.lse)
    ref_out, ref_lse = (t.cpu() for t in attention_ref(c.q, c.k, c.v, mask=c.mask))
    diagnose = (lambda: hint) if hint is not None else \
        lambda: _diagnose(kernel, c, res, out, lse, ref_out) or "follow the docstring step by step"
    _common(c, res, diagnose)
    if res.stray:
        checks.fail(f"your kernel reads outside its inputs ({_what(c)}): " + "; ".join(res.stray),
                    HINT_READS)
    what = f"merged from your splits ({_what(c)})"
    if not torch.equal(torch.isinf(lse), torch.isinf(ref_lse)):
        rows = (torch.isinf(lse) != torch.isinf(ref_lse)).nonzero()[0].tolist()
        checks.fail(f"lse {what} is -inf (no key attended) on the wrong rows, first at batch, "
                    f"head, token {rows}", diagnose())
    base = torch.nan_to_num(attention_naive(c.q, c.k, c.v, mask=c.mask).double().cpu(), nan=0.0)
    mags = functools.cache(lambda: attention_magnitudes(c.q, c.k, c.v, mask=c.mask))
    _compare(out, lse, ref_out, ref_lse, base, mags, c.dtype, what, diagnose)


# ---------------------------------------------------------------------------------------------
# the checks

def check_splits(impl, rng):
    """the parts: lengths 0, 17 and 64 (the whole cache) over 3 splits of 16-key blocks (empty
    splits, more splits than blocks): each key in exactly one split, none at or past L, the work
    shared, each partial the softmax over its own keys with its natural-log lse"""
    kernel = _kernel(impl)
    try:
        _probe(kernel, rng)
    except checks.CheckFailed as e:   # the later checks' hints name it (seed-independent)
        _memo["probe", id(kernel)] = (kernel, str(e).partition("hint: ")[2] or None)
        raise
    _memo["probe", id(kernel)] = (kernel, None)


def check_ragged_grouped(impl, rng):
    """one new token, ragged lengths 50 (the whole cache) and 1 over 4 splits; 4 query heads over
    2 K/V heads; head dim 40 (padded to 64); K and V laid out unlike Q; 32-key blocks"""
    _expect(impl, rng, (50, 1), (4, 2), 1, 50, 40, 4, layouts="bnhd hbnd", block_n=32)


def check_new_tokens(impl, rng):
    """three new tokens (bottom-right causal), float16: lengths 2 (token 0 sees no key), 17 (the
    first tokens see no key of the second split) and 40, over 2 splits; 2 query heads per K/V head"""
    _expect(impl, rng, (2, 17, 40), (2, 1), 3, 40, 32, 2, dtype=torch.float16)


def check_large_logits(impl, rng):
    """large logits: scores up to 360 (a key of every block aligned with the query), 45 keys over
    3 splits"""
    _expect(impl, rng, (45,), (1, 1), 1, 45, 32, 3, q_scale=30.0)


def check_group_sizes(impl, rng):
    """groups of 3 (3 query heads over 1 K/V head, three new tokens: 9 rows of a 16-row tile) and
    4 (8 query heads over 2, five new tokens: 20 rows of a 32-row tile against 16-key blocks),
    ragged lengths, 3 splits"""
    _expect(impl, rng, (37, 3), (3, 1), 3, 40, 32, 3)
    _expect(impl, rng, (21, 40), (8, 2), 5, 40, 16, 3)


@checks.not_under_grade   # loads are seen only where the kernel runs: this process's interpreter
def check_reads(impl, rng):
    """every load stays inside Q, the valid cache (positions < L: the stale ones are never read,
    even masked afterwards) and Seqlens: lengths 37 and 3 of 40, 3 query heads over 1 K/V head
    (the tile's padding rows), three new tokens, head dim 24"""
    _expect(impl, rng, (37, 3), (3, 1), 3, 40, 24, 3, record=True)


CHECKS = [check_splits, check_ragged_grouped, check_new_tokens, check_group_sizes,
          check_large_logits, check_reads]


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: your kernel, float16, 64-key blocks, a ragged batch of lengths 4000,
    1, 0 and 2049 in a 4096 cache over 16 splits, 32 query heads over 8 K/V heads, head dim 128,
    two new tokens"""
    _expect(impl, rng, (4000, 1, 0, 2049), (32, 8), 2, 4096, 128, 16, dtype=torch.float16,
            block_n=64, hint="it passes through the interpreter, so look for what the interpreter "
            "forgives: a load or store past a tensor without its mask (NaN here), or tl.dot of "
            "two dtypes (p.to(v.dtype))")


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex10b(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex10b_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
