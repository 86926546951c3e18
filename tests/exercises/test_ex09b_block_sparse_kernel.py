"""Grader of exercise 09b (lesson 09): the block-sparse forward kernel ``block_sparse_kernel``.

The grader launches the learner's ``@triton.jit`` kernel itself (its own launcher below, the
stub's grid and arguments, the kernel called from a harness kernel of the grader's so that its
body is what runs in every program), through Triton's interpreter on a CPU, on ``flashlib.masks`` masks'
tables: bottom-right causal with Nq > Nk (an empty visit list, rows with no key: out 0, lse
-inf), a causal sliding window (partial blocks only, rows whose first tile masks them entirely),
packed documents, random block patterns that differ per (batch, head); N not a multiple of the
block, blocks of 16, 32 and 64, head dim 40, groups of 1, 2, 3 and 4 query heads per K/V head
(4 over 1, 3 over 1, 4 over 2, 2 over 2), K/V/out laid out unlike Q, float32 and float16, scores
in the hundreds. Results are compared with
``attention_ref`` under the mask's dense form by flashlib.testing's rule (baseline: textbook
attention under the mask in the inputs' dtype; the magnitudes are computed only when the error
is over the bar without them, which they can only raise). Every random choice a mistake's
detection needs is guaranteed, not drawn: no verdict depends on the seed.

Every tensor is a view into a larger buffer filled with NaN (a load past its mask reads NaN, a
store past its mask lands where the grader sees it), and Bitmaps sits between tiles of a fixed
pattern, so a bitmap read for an entry that has none (full entries, those past the count: -1)
changes the result. A failing result is matched against what a kernel computes when it reads the
tables wrongly (partial blocks whole, full and partial swapped, past the count, full blocks
masked, a causal rule or a transposed bitmap, another (batch, head)'s row, the wrong K/V head)
or finishes wrongly (lse in base 2, exp for exp2, an overflowing lse), simulated in float64 from
the same tables, and small probes (NaN from rows with no key, keys past Nk, padded head dims;
once per kernel; one full key block, then several, to tell a tile's arithmetic from the online
softmax across tiles; the same case with one query head per K/V head), so the hint names the
mistake. A read whose value never reaches a store (Q rows past Nq, K rows past Nk under a
bitmap's 0) cannot show in the result: in this process (not under ``flashlib grade``) the
interpreter's loads are recorded, and every address read must lie inside the views of Q, K, V
and the tables. A check takes a fraction of a second.
"""
import contextlib
import math
import types

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashlib import masks, runtime
from flashlib.course import checks, grading
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import attention_magnitudes, max_error, tolerance

pytestmark = pytest.mark.ex09b
# what a learner's file may use of flashlib (the stub's imports)
FLASHLIB_ALLOWED = ("flashlib", "flashlib.runtime", "flashlib.runtime.INTERPRET")
# flashlib's own answer: calling it while graded is "not accepted"
FLASHLIB_ANSWERS = ("flashlib.kernels.block_sparse._partial_mask", "flashlib.kernels.tile.tile_update")

DEV = runtime.DEVICE
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
N_PARAMS = 32
PAD = 2             # tiles of a fixed pattern on each side of Bitmaps

HINT_PARTIAL = ("keys a partial block masks out were attended: the first KvFull[r] entries of the "
                "list are full (no mask), the next KvCount[r] - KvFull[r] are partial, and their "
                "scores need the block's bitmap, Bitmaps[KvBitmap[r, t]] (a BLOCK x BLOCK tile of "
                "uint8, row a = query pid_m * BLOCK + a, column c = key index * BLOCK + c): -inf "
                "where its bit is 0, before the softmax")
HINT_SWAPPED = ("full and partial entries swapped: a list holds its n_full = KvFull[r] full blocks "
                "FIRST (entries 0 .. n_full - 1, attended whole), then the partial ones (entries "
                "n_full .. KvCount[r] - 1, masked with their bitmap)")
HINT_PAST_COUNT = ("the visit list was read past its count: row r lists KvCount[r] key blocks in "
                   "all, full ones included (entries 0 .. KvCount[r] - 1); the entries after "
                   "them are blocks the mask leaves empty, never to be loaded")
HINT_FULL_MASKED = ("a full block was masked with a bitmap: full entries have none (KvBitmap is -1 "
                    "for them, so the load reads before Bitmaps). Attend the first KvFull[r] "
                    "entries whole; read a bitmap only for entries t >= KvFull[r]")
HINT_RULE = ("partial blocks were masked by a causal rule (top-left j <= i, or bottom-right), "
             "not by their bitmap: a partial block's element mask is whatever the mask's rule "
             "says (a window's edge, a document's boundary, the causal diagonal, keys past Nk), "
             "and the bitmap holds it: Bitmaps[KvBitmap[r, t], a, c] for query row "
             "pid_m * BLOCK + a and key index * BLOCK + c")
HINT_BITMAP = ("a bitmap was read at the wrong place: tile m holds query row a (0 .. BLOCK - 1 "
               "within the query block) and key c (within the key block) at Bitmaps + m * BLOCK * "
               "BLOCK + a * BLOCK + c: rows are queries, columns keys")
HINT_ROW = ("the tables were read at another (batch, head)'s row: the mask may differ per batch "
            "and per query head, and program (pid_m, bh) reads row r = bh * cdiv(Nq, BLOCK) + pid_m "
            "(bh = b * Hq + h, the query head, not the K/V head) of KvCount and KvFull, and "
            "entries KvIndex + r * n_kblocks + t")
HINT_GQA = ("grouped heads: query head h reads K/V head h // GROUP (GROUP query heads share one "
            "K/V head), at K + b * stride_kb + (h // GROUP) * stride_kh")
HINT_LSE_BASE2 = ("lse must be in natural log: m and l are in base 2 (exp2 of scores scaled by "
                  "log2(e)), so lse = (m + log2(l)) * ln(2); m + log2(l) is the base-2 log of the sum")
HINT_EXP2 = ("the scores are in base 2 (qk_scale = scale * log2(e)): use tl.math.exp2 on them, "
             "and on the max differences; exp of base-2 scores is a softmax at the wrong temperature")
HINT_EMPTY = ("a row with no visible key (an empty visit list, a row no bitmap lets through, or "
              "one whose first tiles mask it entirely) must not give NaN: its running max is "
              "still -inf, and exp2(s - m) = exp2(-inf - (-inf)) is NaN unless you subtract 0 "
              "there (tl.where(m == -inf, 0, m)); at the end l = 0, so divide by "
              "tl.where(l == 0, 1, l) and write lse = -inf: out 0, lse -inf")
HINT_TAIL = ("keys past Nk were read: a partial block may run past the end of K and V (Nk is not "
             "a multiple of BLOCK). Load K and V with mask cols < Nk (other=0.0); its bitmap is 0 "
             "there, so those scores are -inf")
HINT_HEAD_DIM = ("the padded head dims are read: with D = 24, BLOCK_D = 32 and lanes 24-31 lie past "
                 "each row. Mask offs_d < D on every load (other=0.0) and on the store")
HINT_STORE = ("out rows past Nq (or dims past D) or lse past Nq were written: store out with mask "
              "(offs_m[:, None] < Nq) & (offs_d[None, :] < D) and lse with offs_m < Nq")
HINT_SCALE = ("the scores are not scaled: s = (q @ k^T) * qk_scale (the launcher passes qk_scale = "
              "softmax scale * log2(e), ready for exp2)")
HINT_TILE = ("even one full key block (16 queries x 16 keys, no bitmap) is wrong: for a tile, s = "
             "(q @ k^T) * qk_scale (base 2), m = rowmax(s), p = exp2(s - m[:, None]), l = rowsum(p), "
             "acc = p @ v; then out = acc / l[:, None] and lse = (m + log2(l)) * ln(2)")
HINT_ONLINE = ("one key block is right, several are wrong: the online softmax must carry its state "
               "across the blocks of the list: m_new = max(m_old, rowmax(s)), alpha = exp2(m_old - "
               "m_new), l = l * alpha + rowsum(p), acc = acc * alpha[:, None] + p @ v, with p = "
               "exp2(s - m_new[:, None]); divide by l once, after the last block")
HINT_READS = ("every load must stay inside its tensor, even one whose values never reach a store (a "
              "Q row past Nq only makes an out row that is not stored; a K row past Nk only a score "
              "the bitmap sets to -inf): on a GPU such a read can fault or read another tensor. Mask "
              "Q with rows < Nq and dims < D, K and V with keys < Nk and dims < D")
HINT_LARGE = ("rows with large scores overflow: subtract the running max before exp2, and keep the "
              "max and the sum apart to the end, lse = (m + log2(l)) * ln(2), never "
              "log(exp2(m) * l), whose exp2 overflows float32 past 128")


# ---------------------------------------------------------------------------------------------
# the learner's kernel and the grader's launcher

def _kernel(impl):
    """The learner's block_sparse_kernel (``checks.jit_kernel``)."""
    return checks.jit_kernel(impl, "block_sparse_kernel", "ex09b", N_PARAMS)


def _block_d(d):
    return max(16, triton.next_power_of_2(d))


def _tables(mask, B, Hq):
    """The mask's tables as the kernel reads them: (B, Hq, nQ[, nK]) int32, contiguous, and the
    bitmaps between PAD tiles of a fixed pattern (about half ones, the same for every seed).
    Returns (count, full, index, bitmap, padded bitmaps (n + 2 * PAD, bs, bs))."""
    expand = lambda t: t.expand(B, Hq, *t.shape[2:]).contiguous().cpu()  # noqa: E731
    bs = mask.block_size
    pad = (torch.rand(PAD, bs, bs, generator=torch.Generator().manual_seed(9)) < 0.5).to(torch.uint8)
    bitmaps = torch.cat([pad, mask.bitmaps.cpu(), pad.flip(0)])
    return (*(expand(t) for t in (mask.kv_count, mask.kv_full, mask.kv_index, mask.kv_bitmap)),
            bitmaps)


def _place(x, layout, block):
    """x (B, H, N, D) copied into a view of a NaN buffer: N padded by a block, D past BLOCK_D;
    the buffer's dims in ``layout`` order (e.g. "bnhd"). Returns (view, buf)."""
    B, H, N, D = x.shape
    sizes = dict(b=B, h=H, n=N + block, d=_block_d(D) + 8)
    buf = torch.full([sizes[c] for c in layout], float("nan"), dtype=x.dtype, device=DEV)
    view = buf.permute(*[layout.index(c) for c in "bhnd"])[:, :, :N, :D]
    view.copy_(x)
    return view, buf


def _flat(t, guard, fill):
    """t in a flat buffer with ``guard`` entries of ``fill`` after it: (view, buffer)."""
    buf = torch.full((t.numel() + guard,), fill, dtype=t.dtype, device=DEV)
    buf[:t.numel()] = t.reshape(-1).to(DEV)
    return buf[:t.numel()].view(t.shape), buf


@triton.jit
def _harness(Q, K, V, Out, Lse, KvCount, KvFull, KvIndex, KvBitmap, Bitmaps, stride_qb, stride_qh,
             stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_ob,
             stride_oh, stride_om, Hq, Nq, Nk, D, n_kblocks, qk_scale, GROUP, Ran,
             BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
             KERNEL: tl.constexpr):
    """The learner's kernel (KERNEL) called as Triton code, so that its body is what runs in this
    program (a torch one-liner behind ``kernel[grid]`` does not); then the program marks its
    slot of Ran."""
    KERNEL(Q, K, V, Out, Lse, KvCount, KvFull, KvIndex, KvBitmap, Bitmaps, stride_qb, stride_qh,
           stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_ob,
           stride_oh, stride_om, Hq, Nq, Nk, D, n_kblocks, qk_scale, GROUP, BLOCK, BLOCK_D,
           DOT_PRECISION)
    tl.store(Ran + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), 1)


def _launch(kernel, q, k, v, out, lse, count, full, index, bitmap, bitmaps, n_kblocks, block):
    """The stub's launch: grid (cdiv(Nq, BLOCK), B * Hq), ieee dots."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    grid = (triton.cdiv(Nq, block), B * Hq)
    ran = torch.zeros(math.prod(grid), dtype=torch.int32, device=DEV)
    _harness[grid](
        q, k, v, out, lse, count, full, index, bitmap, bitmaps, *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *out.stride()[:3], Hq, Nq, Nk, D, n_kblocks, LOG2E / math.sqrt(D),
        Hq // Hkv, ran, BLOCK=block, BLOCK_D=_block_d(D), DOT_PRECISION="ieee", num_warps=4,
        num_stages=1, KERNEL=kernel)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    checks.expect_every_program_ran(ran, "block_sparse_kernel", grid)


def _run(kernel, c, *, layouts="bhnd bhnd bhnd bhnd", record=False):
    """Launch on case ``c`` placed in NaN buffers. Returns a namespace with out, lse (float64,
    CPU), whether anything was written outside them or the inputs changed, and with ``record``
    ``stray``: what the loads read outside the inputs' views (None where loads cannot be seen)."""
    lq, lk, lv, lo = layouts.split()
    bs = c.mask.block_size
    (qv, qb), (kv, kb), (vv, vb) = (_place(t, lay, bs) for t, lay in zip((c.q, c.k, c.v), (lq, lk, lv)))
    count, full, index, bitmap, bitmaps = c.tables
    placed = [_flat(t, bs, 0) for t in (count, full, index, bitmap)]
    bitmaps_buf = bitmaps.to(DEV)
    bufs = [qb, kb, vb, *(b for _, b in placed), bitmaps_buf]
    inputs = [b.clone() for b in bufs]
    ov, ob = _place(torch.full_like(c.q, float("nan")), lo, bs)
    B, Hq, Nq, D = c.q.shape
    lse_view, lse_buf = _flat(torch.full((B, Hq, Nq), float("nan")), bs, float("nan"))
    with checks.loads_recorded() if record else contextlib.nullcontext() as loads:
        _launch(kernel, qv, kv, vv, ov, lse_view, *(v for v, _ in placed), bitmaps_buf[PAD:-PAD],
                c.mask.shape[3], bs)
    stray = None if loads is None else _stray_loads(
        loads, [("Q", qv, qb, lq), ("K", kv, kb, lk), ("V", vv, vb, lv)],
        [v for v, _ in placed] + [bitmaps_buf[PAD:-PAD]])
    out, lse = ov.detach().double().cpu(), lse_view.detach().double().cpu()
    ob[tuple(slice(None) if ch in "bh" else slice(0, Nq if ch == "n" else D) for ch in lo)] = float("nan")
    same = lambda a, b: torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())  # noqa: E731
    return types.SimpleNamespace(
        out=out, lse=lse, stray=stray,
        wrote_outside=bool((~torch.isnan(ob)).any() or (~torch.isnan(lse_buf[lse_view.numel():])).any()),
        changed_inputs=not all(same(a, b) for a, b in zip(inputs, bufs)))


def _stray_loads(loads, tensors, tables):
    """What the recorded loads read outside the views: phrases such as "K rows past Nk" (tensors:
    (name, view, buffer, layout) as placed by _place; tables: the views of the mask's tables),
    empty when every load stayed inside them."""
    read = np.unique(np.concatenate(loads)) if loads else np.zeros(0, dtype=np.uint64)
    inside = np.concatenate([checks.element_addresses(view) for _, view, _, _ in tensors]
                            + [checks.element_addresses(view) for view in tables])
    stray, found = read[~np.isin(read, inside)], []
    for name, view, buf, layout in tensors:
        start, size = buf.data_ptr(), buf.element_size()
        mine = stray[(stray >= start) & (stray < start + buf.numel() * size)]
        if mine.size == 0:
            continue
        stray = stray[~np.isin(stray, mine)]
        where = dict(zip(layout, np.unravel_index(((mine - start) // size).astype(np.int64),
                                                  tuple(buf.shape))))
        n, d = view.shape[2], view.shape[3]
        past = "Nq" if name == "Q" else "Nk"
        if (where["n"] >= n).any():
            found.append(f"{name} rows past {past} are loaded (rows "
                         f"{int(where['n'][where['n'] >= n].min())}..{int(where['n'].max())})")
        if (where["d"] >= d).any():
            found.append(f"{name} head dims past D are loaded (dims {d}..{int(where['d'].max())})")
    if stray.size:
        found.append(f"{stray.size} elements outside Q, K, V and the mask's tables are loaded")
    return found


def _case(rng, mask, shape_q, shape_kv, *, dtype=torch.float32, q_scale=1.0):
    """Inputs (rounded to dtype), the mask's tables and dense form, and the float64 results."""
    q = q_scale * rng.standard_normal(shape_q)
    k, v = rng.standard_normal(shape_kv), rng.standard_normal(shape_kv)
    q, k, v = (torch.from_numpy(x).to(DEV, dtype) for x in (q, k, v))
    B, Hq, Nq, _ = shape_q
    dense = mask.to_dense().to(DEV).expand(B, Hq, Nq, shape_kv[2])             # (B, Hq, Nq, Nk)
    out, lse = attention_ref(q, k, v, mask=dense)
    return types.SimpleNamespace(q=q, k=k, v=v, mask=mask, dense=dense, dtype=dtype,
                                 tables=_tables(mask, B, Hq), out=out.cpu(), lse=lse.cpu(), memo={})


def _close(a, b, tol=1e-3):
    a, b = (torch.as_tensor(t, dtype=torch.float64).cpu() for t in (a, b))
    return bool(((a == b) | (a - b).abs().le(tol * (1 + b.abs()))).all())


# ---------------------------------------------------------------------------------------------
# the tables read wrongly, simulated: which mistake

def _allowed(c, plan, *, row=None, rule=None, transposed=False):
    """The pairs a kernel attends when it walks the tables as ``plan`` says, (B, Hq, Nq, nK * bs)
    over keys padded to whole blocks (attended padding has k = v = 0, as a masked load gives).
    plan(n_full, n_all, nK) -> [(entry, "whole" | "masked")]; row(b, h, i) -> the flat row of the
    tables read for query block i of (b, h) (a row past the tables reads their zero guard: an
    empty list); rule(i, j) -> the mask used for "masked" entries instead of the bitmap;
    transposed: each bitmap read transposed."""
    count, full, index, bitmap, bitmaps = c.tables
    B, Hq, Nq, _ = c.q.shape
    bs = c.mask.block_size
    nQ, nK = index.shape[2:]
    allowed = torch.zeros(B, Hq, nQ * bs, nK * bs, dtype=torch.bool)
    a = torch.arange(bs)
    for b in range(B):
        for h in range(Hq):
            for i in range(nQ):
                r = (b * Hq + h) * nQ + i if row is None else row(b, h, i)
                if not 0 <= r < B * Hq * nQ:
                    continue
                rb, rh, ri = r // (Hq * nQ), r // nQ % Hq, r % nQ
                for t, how in plan(int(full[rb, rh, ri]), int(count[rb, rh, ri]), nK):
                    j = int(index[rb, rh, ri, t])
                    if how == "whole":
                        tile = torch.ones(bs, bs, dtype=torch.bool)
                    elif rule is not None:
                        tile = rule(i * bs + a[:, None], j * bs + a[None, :])
                    else:
                        tile = bitmaps[int(bitmap[rb, rh, ri, t]) + PAD].bool()
                        tile = tile.T if transposed else tile
                    allowed[b, h, i * bs:(i + 1) * bs, j * bs:(j + 1) * bs] = tile
    return allowed[:, :, :Nq]


def _attend(c, candidates):
    """out, lse (float64, natural log) of attention under each candidate (allowed, kv_head,
    temperature): allowed (B, Hq, Nq, L) over keys zero-padded to L (whole blocks); kv_head: a
    tuple, the K/V head each query head reads; temperature: a factor on the scores. Evaluated
    together, a few MB at a time: a diagnosis tries many masks."""
    Nk, D = c.k.shape[2], c.q.shape[3]
    results, step = [], max(1, 2**20 // candidates[0][0].numel())
    for start in range(0, len(candidates), step):
        chunk = candidates[start:start + step]
        s, v = [], []
        for allowed, heads, temperature in chunk:
            if heads not in c.memo:             # scores once per case and K/V head map
                q, k, vv = (t.double().cpu() for t in (c.q, c.k, c.v))
                L = allowed.shape[-1]
                k, vv = (torch.nn.functional.pad(t, (0, 0, 0, L - Nk))[:, list(heads)] for t in (k, vv))
                c.memo[heads] = (q @ k.transpose(-1, -2) / math.sqrt(D), vv)  # (B, Hq, Nq, L)
            s.append((temperature * c.memo[heads][0]).masked_fill(~allowed, float("-inf")))
            v.append(c.memo[heads][1])
        s, v = torch.stack(s), torch.stack(v)                                    # (C, B, Hq, ...)
        lse = torch.logsumexp(s, dim=-1)                                         # (C, B, Hq, Nq)
        p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])  # empty rows: 0
        results += list(zip(p @ v, lse))
    return results


PLANS = [  # (how the tables are read, the hint): plan(n_full, n_all, nK) -> entries
    (lambda f, n, nK: [(t, "whole") for t in range(n)], HINT_PARTIAL),
    (lambda f, n, nK: [(t, "masked" if t < n - f else "whole") for t in range(n)], HINT_SWAPPED),
    (lambda f, n, nK: [(t, "whole" if t < f else "masked") for t in range(nK)], HINT_PAST_COUNT),
    (lambda f, n, nK: [(t, "whole" if t < f else "masked") for t in range(min(nK, f + n))],
     HINT_PAST_COUNT),
    (lambda f, n, nK: [(t, "masked") for t in range(n)], HINT_FULL_MASKED),
]
RIGHT = lambda f, n, nK: [(t, "whole" if t < f else "masked") for t in range(n)]  # noqa: E731


def _diagnose(kernel, c, res):
    """Name the likely mistake of result ``res`` on case ``c``, or None."""
    if torch.isnan(res.out).any() or torch.isnan(res.lse).any():
        return _diagnose_nan(kernel, c, res)
    if res.wrote_outside:
        return HINT_STORE
    tol = 1e-3 if c.dtype == torch.float32 else 1e-2    # float16: its rounding is not a mistake
    if _close(res.out, c.out, tol) and _close(res.lse, c.lse / LN2, tol):
        return HINT_LSE_BASE2
    if _close(res.out, c.out, tol) and torch.isinf(res.lse[torch.isfinite(c.lse)]).any():
        return HINT_LARGE
    B, Hq, Nq, _ = c.q.shape
    Hkv, Nk = c.k.shape[1], c.k.shape[2]
    nQ, G = c.tables[0].shape[2], Hq // Hkv
    own = tuple(h // G for h in range(Hq))
    right = _allowed(c, RIGHT)
    # (allowed, K/V head of each query head, temperature, lse compared too, hint), in order
    wrong = [(right, own, LOG2E, False, HINT_EXP2),
             (right, own, math.sqrt(c.q.shape[3]) * LN2, False, HINT_SCALE)]
    if 1 < Hkv < Hq:
        wrong.append((right, tuple(h % Hkv for h in range(Hq)), 1.0, True, HINT_GQA))
    masked = [(_allowed(c, plan), hint) for plan, hint in PLANS]
    masked += [(_allowed(c, RIGHT, rule=rule), HINT_RULE)
               for rule in (lambda i, j: j <= i, lambda i, j: j <= i + Nk - Nq)]
    masked.append((_allowed(c, RIGHT, transposed=True), HINT_BITMAP))
    masked += [(_allowed(c, RIGHT, row=row), HINT_ROW)
               for row in (lambda b, h, i: h * nQ + i,                    # the batch left out
                           lambda b, h, i: (b * Hq + h // G) * nQ + i,    # the K/V head's row
                           lambda b, h, i: (b * Hkv + h // G) * nQ + i,
                           lambda b, h, i: b * Hq + h + i,                # bh not times nQ
                           lambda b, h, i: i)]                            # (0, 0)'s rows for all
    tried = {right.numpy().tobytes()}
    for allowed, hint in masked:   # each distinct mask once, with and without keys past Nk
        for a in (allowed, allowed & (torch.arange(allowed.shape[-1]) < Nk)):
            if a.numpy().tobytes() not in tried:
                tried.add(a.numpy().tobytes())
                wrong.append((a, own, 1.0, True, hint))
    for (out, lse), (*_, with_lse, hint) in zip(_attend(c, [w[:3] for w in wrong]), wrong):
        if _close(res.out, out, tol) and (not with_lse or _close(res.lse, lse, tol)):
            return hint
    if kernel not in _STAGE_PROBES:
        _STAGE_PROBES[kernel] = _stage_probes(kernel)
    if _STAGE_PROBES[kernel] is not None:
        return _STAGE_PROBES[kernel]
    return _grouped_probe(kernel, c)


def _grouped_probe(kernel, c):
    """HINT_GQA if the kernel is right on case ``c`` with K/V repeated to one head per query head
    (GROUP = 1) where it is wrong on the grouped case, else None."""
    Hq, Hkv = c.q.shape[1], c.k.shape[1]
    if Hq == Hkv:
        return None
    one = types.SimpleNamespace(**{**vars(c), "k": c.k.repeat_interleave(Hq // Hkv, 1),
                                   "v": c.v.repeat_interleave(Hq // Hkv, 1), "memo": {}})
    alone = _run(kernel, one)
    tol = 1e-3 if c.dtype == torch.float32 else 1e-2
    return HINT_GQA if _close(alone.out, c.out, tol) and _close(alone.lse, c.lse, tol) else None


_STAGE_PROBES = {}


def _full_blocks(n_blocks):
    """16 queries attending n_blocks full key blocks of 16 (no bitmap); for several blocks the
    keys grow from block to block, so that the running max moves."""
    return masks.from_block_tensor(torch.ones(1, 1, 1, n_blocks, dtype=torch.bool, device=DEV), 16,
                                   16 * n_blocks, block_size=16)


def _stage_probes(kernel):
    """A tile's arithmetic (one full block), then the online softmax across tiles (four full
    blocks whose keys grow): the first that is wrong names the hint, or None."""
    for n_blocks, hint in ((1, HINT_TILE), (4, HINT_ONLINE)):
        c = _case(np.random.default_rng(6), _full_blocks(n_blocks), (1, 1, 16, 16),
                  (1, 1, 16 * n_blocks, 16))
        if n_blocks > 1:
            grow = torch.linspace(0.5, 3, 16 * n_blocks, device=DEV)[None, None, :, None]
            c.k = c.k * grow.to(c.k.dtype)
            c.out, c.lse = (t.cpu() for t in attention_ref(c.q, c.k, c.v, mask=c.dense))
        res = _run(kernel, c)
        if not (_close(res.out, c.out) and _close(res.lse, c.lse)):
            right = _attend(c, [(_allowed(c, RIGHT), (0,), math.sqrt(16) * LN2)])[0][0]
            return HINT_SCALE if _close(res.out, right) else hint
    return None


def _probe(kernel, mask, D):
    """(case, result, has NaN) of a small float32 probe, one head."""
    c = _case(np.random.default_rng(5), mask, (1, 1, mask.seqlen_q, D), (1, 1, mask.seqlen_k, D))
    res = _run(kernel, c)
    return c, res, bool(torch.isnan(res.out).any() or torch.isnan(res.lse).any())


def _diagnose_nan(kernel, c, res):
    """NaN in a result: rows with no key, keys past Nk, padded head dims, or overflow."""
    nan_rows = torch.isnan(res.out).any(-1) | torch.isnan(res.lse)             # (B, Hq, Nq)
    if (nan_rows & torch.isneginf(c.lse)).any():
        return HINT_EMPTY
    if kernel not in _NAN_PROBES:       # the probes depend on the kernel only: run them once
        _NAN_PROBES[kernel] = _nan_probes(kernel)
    return (_NAN_PROBES[kernel] or _grouped_probe(kernel, c)
            or (HINT_LARGE if c.q.abs().max() > 10 else None))


_NAN_PROBES = {}


def _nan_probes(kernel):
    """Nk a multiple of the block and D = BLOCK_D first: there only rows with no key (yet) give NaN."""
    if _probe(kernel, masks.causal(48, 32, block_size=16), 16)[2]:
        return HINT_EMPTY                       # query block 0 lists nothing
    if _probe(kernel, masks.sliding_window(32, 64, 20, block_size=16), 16)[2]:
        return HINT_EMPTY                       # row 15's first tile masks it entirely
    if _probe(kernel, masks.causal(32, 40, block_size=16), 16)[2]:
        return HINT_TAIL
    if _probe(kernel, masks.causal(32, 32, block_size=16), 24)[2]:
        return HINT_HEAD_DIM
    return None


# ---------------------------------------------------------------------------------------------
# one case against the oracle

def _naive_lse(c):
    """logsumexp of the scaled, masked scores in float32 (the lse baseline), -inf on empty rows."""
    q, k = c.q.float(), c.k.float().repeat_interleave(c.q.shape[1] // c.k.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5                      # (B, Hq, Nq, Nk)
    return torch.logsumexp(s.masked_fill(~c.dense, float("-inf")), dim=-1)


def _expect(impl, rng, mask, shape_q, shape_kv, *, dtype=torch.float32, q_scale=1.0,
            layouts="bhnd bhnd bhnd bhnd", record=False):
    kernel = _kernel(impl)
    c = _case(rng, mask, shape_q, shape_kv, dtype=dtype, q_scale=q_scale)
    what = (f"{str(dtype)[6:]} q {tuple(shape_q)}, k and v {tuple(shape_kv)}, mask {mask.name} "
            f"(blocks of {mask.block_size})" + (f", q x {q_scale:g}" if q_scale != 1 else "")
            + ("" if layouts == "bhnd bhnd bhnd bhnd" else f", layouts q k v out: {layouts}"))
    res = _run(kernel, c, layouts=layouts, record=record)
    diagnose = lambda: _diagnose(kernel, c, res) or "follow the docstring step by step"  # noqa: E731
    if res.changed_inputs:
        checks.fail(f"your kernel changed its inputs (q, k, v or the mask's tables; {what})",
                    "write only Out and Lse")
    if res.wrote_outside:
        checks.fail(f"your kernel wrote outside out[:, :, :Nq, :D] or lse ({what})", HINT_STORE)
    if res.stray:
        checks.fail(f"your kernel reads outside its inputs ({what}): " + "; ".join(res.stray),
                    HINT_READS)
    for name, got in (("out", res.out), ("lse", res.lse)):
        nan = torch.isnan(got)
        if nan.any():
            rows = (nan.any(-1) if nan.dim() == 4 else nan).nonzero()[:, -1].unique().tolist()
            checks.fail(f"{name} of {what} has NaN in query rows {rows[:8]}"
                        f"{' ...' if len(rows) > 8 else ''}", diagnose())
    naive = attention_naive(c.q, c.k, c.v, mask=c.dense).cpu().nan_to_num()   # empty rows: 0
    results = (("out", res.out, c.out, naive, dtype),
               ("lse", res.lse, c.lse, _naive_lse(c).cpu(), torch.float32))
    mags = None
    for name, got, want, baseline, tol_dtype in results:
        if max_error(got, want) <= tolerance(want, baseline, tol_dtype):
            continue        # within the tolerance without the magnitudes, so within it with them
        if mags is None:
            mags = attention_magnitudes(c.q, c.k, c.v, mask=c.dense)
        checks.expect_close(got, want, name=f"{name} of {what}", dtype=tol_dtype,
                            baseline=baseline, hint=diagnose, magnitude=mags[name])


def _random_blocks(rng, B, H, Nq, Nk, bs):
    """A (B, H) BlockMask, causal inside, one query block: slice (0, 0) lists nothing, the others
    distinct non-empty patterns of key blocks (drawn without replacement), so a wrong row of the
    tables or a wrong K/V head shows whatever the seed. For 16 x 50 in blocks of 16 every key
    block has pairs the causal rule allows, the first two full, the others partial: any 7
    distinct patterns include both kinds."""
    nK = -(-Nk // bs)
    assert Nq <= bs and B * H - 1 < 2 ** nK
    chosen = rng.choice(2 ** nK - 1, B * H - 1, replace=False) + 1              # distinct, not 0
    bits = torch.tensor([0, *chosen.tolist()])[:, None] >> torch.arange(nK) & 1  # (B * H, nK)
    mask = masks.from_block_tensor(bits.bool().reshape(B, H, 1, nK).to(DEV), Nq, Nk,
                                   block_size=bs, causal=True)
    mask.name = "random blocks per (batch, head), causal"
    return mask


# ---------------------------------------------------------------------------------------------
# the checks

def check_causal(impl, rng):
    """bottom-right causal with Nq > Nk, blocks of 16: 56 queries x 40 keys (query block 0 lists
    nothing, rows 0-15 see no key: out 0, lse -inf; the others list their full blocks, if any,
    then the partial diagonal block, the last one running past Nk); 4 query heads over 1 K/V
    head"""
    _expect(impl, rng, masks.causal(56, 40, block_size=16, device=DEV), (1, 4, 56, 32), (1, 1, 40, 32))


def check_sliding_window(impl, rng):
    """a causal sliding window of 24 keys, 70 queries x 90 keys, blocks of 64, head dim 40 (padded
    to 64), 3 query heads over 1 K/V head: lists of partial blocks only, rows whose first tile
    masks them entirely"""
    _expect(impl, rng, masks.sliding_window(70, 90, 24, block_size=64, device=DEV),
            (1, 3, 70, 40), (1, 1, 90, 40))


def check_random_blocks_grouped_heads(impl, rng):
    """random block patterns that differ per (batch, head) (one empty visit list), causal inside,
    blocks of 16, 16 x 50: 2 batches, 4 query heads over 2 K/V heads, K/V/out laid out unlike Q,
    float16"""
    mask = _random_blocks(rng, 2, 4, 16, 50, 16)
    _expect(impl, rng, mask, (2, 4, 16, 16), (2, 2, 50, 16), dtype=torch.float16,
            layouts="bhnd bnhd hbnd nbhd")


def check_documents_large_logits(impl, rng):
    """packed documents (causal, lengths 70, 9, 21), blocks of 32: full blocks inside a document,
    partial ones at their edges; q x 30 (scores in the hundreds); 2 query heads over 2 K/V heads"""
    docs = torch.repeat_interleave(torch.arange(3), torch.tensor([70, 9, 21])).to(DEV)
    _expect(impl, rng, masks.document(docs, block_size=32), (1, 2, 100, 16), (1, 2, 100, 16),
            q_scale=30.0)


@checks.not_under_grade   # loads are seen only where the kernel runs: this process's interpreter
def check_reads(impl, rng):
    """every load stays inside its tensor, also the reads whose values never reach a store:
    causal 56 x 40 (query rows past Nq, keys past Nk in the diagonal blocks), blocks of 16, head
    dim 24, 2 query heads over 1 K/V head"""
    _expect(impl, rng, masks.causal(56, 40, block_size=16, device=DEV), (1, 2, 56, 24),
            (1, 1, 40, 24), record=True)


CHECKS = [check_causal, check_sliding_window, check_random_blocks_grouped_heads,
          check_documents_large_logits, check_reads]


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: your kernel, float16, blocks of 64, Nq = 1000, Nk = 1100, head dim
    80, a causal sliding window of 300 keys (2 batches, 8 query heads over 2 K/V heads)"""
    _expect(impl, rng, masks.sliding_window(1000, 1100, 300, block_size=64, device=DEV),
            (2, 8, 1000, 80), (2, 2, 1100, 80), dtype=torch.float16)


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex09b(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex09b_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
