"""Grader of exercise 08b (lesson 08): the FA2 backward's dK/dV kernel ``dkdv_kernel``.

The grader launches the learner's ``@triton.jit`` kernel itself (its own launcher below, the
stub's grid and arguments, the kernel called from a harness kernel of the grader's so that its
body is what runs in every program; the learner's ``attention_backward_dkdv`` is not used), through
Triton's interpreter on a CPU, on small irregular shapes: blocks of 32 x 32, 16 x 32 and 32 x 16
(BLOCK_M x BLOCK_N: a kernel that takes one for the other is wrong one way or the other), Nq !=
Nk, N not a multiple of the block, head dim 24 (padded to 32), several batches, groups of 1, 2, 3
and 4 query heads per K/V head, K/V/dO/dK/dV laid out differently from Q, causal on and off
(bottom-right, diagonal offset Nk - Nq not a multiple of the block; Nq > Nk gives rows with no
key, lse = -inf, whose share is 0), large logits, an all-zero dO (dK and dV exactly 0), float32
and float16.
lse and delta = rowsum(dO * O) come from attention_ref in float64 (stored as float32), as the
forward and the dQ pass would give them. dK and dV are compared with torch.autograd through
attention_ref in float64 under flashlib.testing's rule (baseline: autograd of textbook attention
in the inputs' dtype; magnitudes from attention_magnitudes).

Every tensor is a view into a larger buffer filled with NaN: a load without its mask (rows past
N, head dims past D) reads NaN, deterministically and inside the buffer; a store without its
mask writes where the grader sees it. The inputs must come back unchanged. A read whose value
never reaches a store (K rows past Nk, Lse rows past Nq) cannot show in dK and dV: in this
process (not under ``flashlib grade``) the interpreter's loads are recorded and every address
read must lie inside the views of Q, K, V, dO, Lse and Delta.

A failing result is matched against the gradients of plausible wrong formulas (lse left in
natural log under exp2, dK scaled twice or not at all, delta left out, dV from dS, top-left or
strict causal, blocks above the diagonal unmasked, only the first query head of a group) and
small probes (NaN from rows past Nq, from padded head dims, from rows with no key; the same case
with square blocks, or with one query head per K/V head, right where this one is wrong), so the
hint names the mistake. Each check takes a fraction of a second through the interpreter.
"""
import contextlib
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
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex08b
# what a learner's file may use of flashlib (the stub's imports)
FLASHLIB_ALLOWED = ("flashlib", "flashlib.runtime", "flashlib.runtime.INTERPRET")
# flashlib's own answer: calling it while graded is "not accepted"
FLASHLIB_ANSWERS = ("flashlib.kernels.fa2_bwd.dkdv_tile",)

DEV = runtime.DEVICE
BLOCK = 32          # the probes' BLOCK_M = BLOCK_N
SQUARE, TALL, WIDE = (BLOCK, BLOCK), (16, 32), (32, 16)     # (BLOCK_M, BLOCK_N)
LOG2E = math.log2(math.e)
N_PARAMS = 37

HINT_BASE2 = ("lse is a natural log: under exp2 both sides need the factor log2(e), P = "
              "exp2(S * LOG2E - lse * LOG2E) (S = scale * q.k); exp2(S * LOG2E - lse) is not P")
HINT_DK_TWICE = ("dK is scaled twice: dK += scale * dS^T Q, once. If your scores already carry "
                 "the scale (S = scale * q.k), dS does not: multiply dK by scale once, at the end")
HINT_DK_SCALE = ("dK lacks the softmax scale: S = scale * Q K^T, so dK = scale * sum dS^T Q "
                 "(multiply once, e.g. dk * scale before the store)")
HINT_DELTA = ("dS = P * (dP - delta): you left out delta_i = rowsum(dO_i * O_i) (loaded from "
              "Delta, one float per query row, like lse)")
HINT_DV_FROM_DS = "dV is the gradient through O = P V: dV += P^T dO, with P, not dS"
HINT_DV = ("dV is wrong while dK is right: dV_j += P^T dO_i, a (BN, BM) tile times a (BM, BD) "
           "one; tl.dot(p, do) multiplies the wrong dims (transpose P: tl.trans(p), or compute "
           "the scores transposed, k @ q^T)")
HINT_DK = ("dK is wrong while dV is right: dP = dO V^T (BM, BN), dS = P * (dP - delta[:, None]), "
           "dK += dS^T Q (a (BN, BM) tile times a (BM, BD) one), times scale once")
HINT_TOP_LEFT = ("causal here is bottom-right aligned: query i sees key j iff j <= i + Nk - Nq "
                 "(as in the forward, exercise 07b). Your mask is top-left (j <= i), which "
                 "differs when Nq != Nk; the first query block to visit moves with it too")
HINT_STRICT = ("causal is off by one: query i sees key j iff j <= i + Nk - Nq (the diagonal "
               "included: every row sees its own position), not j < i + Nk - Nq")
HINT_ABOVE = ("query blocks entirely above the diagonal (no row sees a key of this block) add "
              "to dK and dV: skip them (start the query loop at the block of row "
              "start_n - (Nk - Nq), rounded down to BLOCK_M), or mask every block you visit")
HINT_CAUSAL = ("causal is wrong although non-causal is right: P is 0 where j > i + Nk - Nq "
               "(bottom-right), and the query loop must reach every row that sees a key of this "
               "block: from the block of row start_n - (Nk - Nq) (rounded down) to Nq")
HINT_GQA = ("grouped heads: dK and dV of K/V head hkv sum over all GROUP query heads "
            "hkv * GROUP + g, g = 0 .. GROUP - 1 (loop over them: for g in range(GROUP)); Lse and "
            "Delta rows of head h start at (b * Hq + h) * Nq, with Hq = Hkv * GROUP")
HINT_QUERY_ROWS = ("query rows past Nq are read: when Nq is not a multiple of BLOCK_M the last "
                   "query block runs past the end of Q, dO, Lse and Delta. Load them with mask "
                   "offs_m < Nq (other=0.0) and set P to 0 on those rows")
HINT_HEAD_DIM = ("the padded head dims are read: with D = 24, BLOCK_D = 32 and lanes 24-31 lie "
                 "past each row. Mask offs_d < D on every load (other=0.0) and on the stores")
HINT_EMPTY = ("rows with no visible key (causal with Nq > Nk) have lse = -inf: exp2(S - lse) "
              "is exp2(+inf) there, and exp2(-inf - (-inf)) is NaN. Zero P where the mask is "
              "False with tl.where(visible, exp2(...), 0.0) after the exp2, not -inf scores "
              "before it (or load such lse as +inf)")
HINT_STORE = ("dK and dV rows past Nk (or dims past D) were written: store with mask "
              "(offs_n[:, None] < Nk) & (offs_d[None, :] < D)")
HINT_BLOCKS = ("right with square blocks, wrong with BLOCK_M != BLOCK_N: query tiles are BLOCK_M "
               "rows (offs_m = start_m + tl.arange(0, BLOCK_M), the loop steps by BLOCK_M), key "
               "tiles BLOCK_N rows (this program's keys start at pid_n * BLOCK_N), and the causal "
               "loop starts at row pid_n * BLOCK_N - (Nk - Nq) rounded down to a multiple of "
               "BLOCK_M")
HINT_READS = ("every load must stay inside its tensor, even one whose values never reach dK or dV "
              "(a K row past Nk only makes dK rows that are not stored; an Lse row past Nq is "
              "zeroed by the mask): on a GPU such a read can fault or read another tensor. Mask "
              "it: K and V with rows < Nk and dims < D, Q and dO with rows < Nq and dims < D, Lse "
              "and Delta with rows < Nq")
HINT_OFFSETS = ("batch and head offsets: program (pid_n, bkv) owns batch bkv // Hkv and K/V head "
                "bkv % Hkv; each tensor has its own strides (stride_kb, stride_kh, stride_kn for "
                "K, stride_dob ... for dO, and so on)")


# ---------------------------------------------------------------------------------------------
# the learner's kernel and the grader's launcher

def _kernel(impl):
    """The learner's dkdv_kernel (``checks.jit_kernel``)."""
    return checks.jit_kernel(impl, "dkdv_kernel", "ex08b", N_PARAMS)


def _block_d(d):
    return max(16, triton.next_power_of_2(d))


@triton.jit
def _harness(Q, K, V, dO, Lse, Delta, dK, dV, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh,
             stride_kn, stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
             stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, Hkv, Nq, Nk, D,
             scale, GROUP, Ran, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, KERNEL: tl.constexpr):
    """The learner's kernel (KERNEL) called as Triton code, so that its body is what runs in this
    program (a torch one-liner behind ``kernel[grid]`` does not); then the program marks its
    slot of Ran."""
    KERNEL(Q, K, V, dO, Lse, Delta, dK, dV, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh,
           stride_kn, stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
           stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, Hkv, Nq, Nk, D,
           scale, GROUP, CAUSAL, BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION)
    tl.store(Ran + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), 1)


def _launch(kernel, q, k, v, do, lse, delta, dk, dv, causal, blocks=SQUARE):
    """The stub's launch: grid (cdiv(Nk, BLOCK_N), B * Hkv), blocks (BLOCK_M, BLOCK_N), ieee
    dots."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    block_m, block_n = blocks
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    ran = torch.zeros(math.prod(grid), dtype=torch.int32, device=DEV)
    _harness[grid](
        q, k, v, do, lse, delta, dk, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *do.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], Hkv, Nq, Nk, D, 1.0 / math.sqrt(D),
        Hq // Hkv, ran, CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_block_d(D),
        DOT_PRECISION="ieee", num_warps=4, num_stages=1, KERNEL=kernel)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    checks.expect_every_program_ran(ran, "dkdv_kernel", grid)


def _place(x, layout, block):
    """x (B, H, N, D) copied into a view of a NaN buffer: N padded by a block, D past BLOCK_D;
    the buffer's dims in ``layout`` order (e.g. "bnhd"). Returns (view, buf)."""
    B, H, N, D = x.shape
    sizes = dict(b=B, h=H, n=N + block, d=_block_d(D) + 8)
    buf = torch.full([sizes[c] for c in layout], float("nan"), dtype=x.dtype, device=DEV)
    view = buf.permute(*[layout.index(c) for c in "bhnd"])[:, :, :N, :D]
    view.copy_(x)
    return view, buf


def _rows(x, block):
    """x (B, H, N) float32 in a flat NaN buffer with a block of NaN after it."""
    buf = torch.full((x.numel() + block,), float("nan"), dtype=torch.float32, device=DEV)
    buf[:x.numel()] = x.reshape(-1)
    return buf[:x.numel()].view(x.shape), buf


def _run(kernel, case, *, layouts="bhnd bhnd bhnd bhnd bhnd bhnd", record=False):
    """Launch on ``case`` placed in NaN buffers. Returns a namespace with dk, dv as float64 CPU
    tensors, whether anything was written outside them or the inputs changed, and with
    ``record`` ``stray``: what the loads read outside the inputs' views (None where loads cannot
    be seen)."""
    block = max(case.blocks)
    lq, lk, lv, ldo, ldk, ldv = layouts.split()
    placed = [_place(t, lay, block) for t, lay in zip((case.q, case.k, case.v, case.do), (lq, lk, lv, ldo))]
    (lse, lse_buf), (delta, delta_buf) = _rows(case.lse, block), _rows(case.delta, block)
    bufs = [b for _, b in placed] + [lse_buf, delta_buf]
    inputs = [b.clone() for b in bufs]
    (dkv, dkb), (dvv, dvb) = (_place(torch.full_like(case.k, float("nan")), lay, block)
                              for lay in (ldk, ldv))
    with checks.loads_recorded() if record else contextlib.nullcontext() as loads:
        _launch(kernel, *[v for v, _ in placed], lse, delta, dkv, dvv, case.causal, case.blocks)
    stray = None if loads is None else _stray_loads(
        loads, [(name, view, buf, lay) for name, (view, buf), lay
                in zip(("Q", "K", "V", "dO"), placed, (lq, lk, lv, ldo))],
        [("Lse", lse, lse_buf), ("Delta", delta, delta_buf)])
    dk, dv = dkv.detach().double().cpu(), dvv.detach().double().cpu()
    Nk, D = case.k.shape[2], case.k.shape[3]
    for buf, lay in ((dkb, ldk), (dvb, ldv)):
        buf[tuple(slice(None) if c in "bh" else slice(0, Nk if c == "n" else D) for c in lay)] = float("nan")
    same = lambda a, b: torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())  # noqa: E731
    return types.SimpleNamespace(
        dk=dk, dv=dv, stray=stray, wrote_outside=bool((~torch.isnan(dkb)).any() or (~torch.isnan(dvb)).any()),
        changed_inputs=not all(same(a, b) for a, b in zip(inputs, bufs)))


def _stray_loads(loads, tensors, rows):
    """What the recorded loads read outside the views: phrases such as "K rows past Nk" (tensors:
    (name, view, buffer, layout) as placed by _place; rows: (name, view, buffer) as placed by
    _rows), empty when every load stayed inside them."""
    read = np.unique(np.concatenate(loads)) if loads else np.zeros(0, dtype=np.uint64)
    inside = np.concatenate([checks.element_addresses(view) for _, view, _, _ in tensors]
                            + [checks.element_addresses(view) for _, view, _ in rows])
    stray, found = read[~np.isin(read, inside)], []
    for name, view, buf, *layout in tensors + rows:
        start, size = buf.data_ptr(), buf.element_size()
        mine = stray[(stray >= start) & (stray < start + buf.numel() * size)]
        if mine.size == 0:
            continue
        stray = stray[~np.isin(stray, mine)]
        past = "Nq" if name in ("Q", "dO", "Lse", "Delta") else "Nk"
        if not layout:                                  # Lse, Delta: flat, a block after the end
            found.append(f"{name} rows past {past} are loaded")
            continue
        where = dict(zip(layout[0], np.unravel_index(((mine - start) // size).astype(np.int64),
                                                     tuple(buf.shape))))
        n, d = view.shape[2], view.shape[3]
        if (where["n"] >= n).any():
            found.append(f"{name} rows past {past} are loaded (rows "
                         f"{int(where['n'][where['n'] >= n].min())}..{int(where['n'].max())})")
        if (where["d"] >= d).any():
            found.append(f"{name} head dims past D are loaded (dims {d}..{int(where['d'].max())})")
    if stray.size:
        found.append(f"{stray.size} elements outside the buffers of the inputs are loaded")
    return found


def _case(rng, shape_q, shape_kv, *, causal, dtype=torch.float32, q_scale=1.0, zero_dout=False,
          blocks=SQUARE):
    """Inputs, lse and delta (from attention_ref in float64) and the float64 gradients."""
    q = q_scale * rng.standard_normal(shape_q)
    k, v = rng.standard_normal(shape_kv), rng.standard_normal(shape_kv)
    do = np.zeros(shape_q) if zero_dout else rng.standard_normal(shape_q)
    q, k, v, do = (torch.from_numpy(x).to(DEV, dtype) for x in (q, k, v, do))  # rounded inputs
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*leaves, causal=causal)
    out.backward(do.double())
    delta = (do.double() * out.detach()).sum(-1)
    return types.SimpleNamespace(
        q=q, k=k, v=v, do=do, causal=causal, dtype=dtype, blocks=blocks,
        lse=lse.detach().float(), delta=delta.float(),
        q64=leaves[0].detach(), k64=leaves[1].detach(), v64=leaves[2].detach(), do64=do.double(),
        lse64=lse.detach().float().double(), delta64=delta.float().double(),
        dk=leaves[1].grad, dv=leaves[2].grad)


def _close(a, b, tol=1e-3):
    a, b = (torch.as_tensor(t, dtype=torch.float64).cpu() for t in (a, b))
    return bool(((a == b) | (a - b).abs().le(tol * (1 + b.abs()))).all())


# ---------------------------------------------------------------------------------------------
# wrong formulas and probes: which mistake

def _formulas(c, *, mask="bottom_right", base2=False, dk_factor=1.0, delta=True, dv_from_p=True,
              first_head_only=False):
    """dK, dV (float64) from the case's float32 lse and delta; the keywords build wrong ones."""
    q, k, v, do = c.q64, c.k64, c.v64, c.do64
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G, scale = Hq // Hkv, 1.0 / math.sqrt(D)
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)             # (B, Hq, Nk, D)
    s = scale * q @ kk.transpose(-1, -2)                                      # (B, Hq, Nq, Nk)
    i, j = torch.arange(Nq, device=q.device)[:, None], torch.arange(Nk, device=q.device)[None, :]
    allowed = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    bm, bn = c.blocks
    if c.causal:
        allowed = {"bottom_right": j <= i + Nk - Nq, "strict": j < i + Nk - Nq, "top_left": j <= i,
                   # whole tiles above the diagonal visited unmasked
                   "above": (j <= i + Nk - Nq) | ((i // bm + 1) * bm - 1 + Nk - Nq < j // bn * bn)}[mask]
    lse = c.lse64[..., None]
    expo = s * LOG2E - lse if base2 else s - lse
    p = torch.where(allowed, torch.exp2(expo) if base2 else torch.exp(expo), 0.0)
    dp = do @ vv.transpose(-1, -2)
    ds = p * (dp - c.delta64[..., None]) if delta else p * dp
    dk = dk_factor * scale * ds.transpose(-1, -2) @ q                        # (B, Hq, Nk, D)
    dv = (p if dv_from_p else ds).transpose(-1, -2) @ do
    fold = (lambda t: t.reshape(B, Hkv, G, Nk, D)[:, :, 0]) if first_head_only else \
        (lambda t: t.reshape(B, Hkv, G, Nk, D).sum(2))
    return fold(dk), fold(dv)


def _probe(kernel, shape_q, shape_kv, causal, blocks=SQUARE):
    """(case, result, has NaN) of one small float32 probe."""
    c = _case(np.random.default_rng(5), shape_q, shape_kv, causal=causal, blocks=blocks)
    res = _run(kernel, c)
    return c, res, bool(torch.isnan(res.dk).any() or torch.isnan(res.dv).any())


def _diagnose_nan(kernel):
    if _probe(kernel, (1, 1, 37, 16), (1, 1, 48, 16), False)[2]:
        return HINT_QUERY_ROWS
    if _probe(kernel, (1, 1, 32, 24), (1, 1, 48, 24), False)[2]:
        return HINT_HEAD_DIM
    # causal without empty rows, query block 0 entirely above key block 2 (diagonal offset 5)
    c, res, nan = _probe(kernel, (1, 1, 70, 16), (1, 1, 75, 16), True)
    if not nan and not (_close(res.dk, c.dk) and _close(res.dv, c.dv)):
        return _diagnose(kernel, c, res)
    if nan or _probe(kernel, (1, 1, 50, 16), (1, 1, 37, 16), True)[2]:
        return HINT_EMPTY
    return None


def _right(kernel, shape_q, shape_kv, causal, blocks=SQUARE):
    """Whether the kernel is right (no NaN, close to the float64 gradients) on a float32 probe."""
    c, res, nan = _probe(kernel, shape_q, shape_kv, causal, blocks)
    return not nan and not res.wrote_outside and _close(res.dk, c.dk) and _close(res.dv, c.dv)


def _diagnose(kernel, c, res):
    """Name the likely mistake of result ``res`` on case ``c``, or None."""
    if torch.isnan(res.dk).any() or torch.isnan(res.dv).any():
        return _diagnose_nan(kernel)
    if res.wrote_outside:
        return HINT_STORE
    scale = 1.0 / math.sqrt(c.q.shape[-1])
    wrong = [(dict(base2=True), HINT_BASE2), (dict(dk_factor=scale), HINT_DK_TWICE),
             (dict(dk_factor=1 / scale), HINT_DK_SCALE), (dict(delta=False), HINT_DELTA),
             (dict(dv_from_p=False), HINT_DV_FROM_DS), (dict(first_head_only=True), HINT_GQA)]
    if c.causal:
        wrong += [(dict(mask="top_left"), HINT_TOP_LEFT), (dict(mask="strict"), HINT_STRICT),
                  (dict(mask="above"), HINT_ABOVE)]
    for kwargs, hint in wrong:
        dk, dv = _formulas(c, **kwargs)
        if _close(res.dk, dk) and _close(res.dv, dv):
            return hint
    # the same shapes with square blocks, then with one query head per K/V head: which one breaks
    B, Hq, Nq, D = c.q.shape
    Hkv, Nk = c.k.shape[1], c.k.shape[2]
    if c.blocks[0] != c.blocks[1] and _right(kernel, (B, Hq, Nq, D), (B, Hkv, Nk, D), c.causal):
        return HINT_BLOCKS
    if Hq != Hkv and _right(kernel, (B, Hkv, Nq, D), (B, Hkv, Nk, D), c.causal, c.blocks):
        return HINT_GQA
    dk, dv = _formulas(c)
    dk_ok, dv_ok = _close(res.dk, dk), _close(res.dv, dv)
    if dk_ok and not dv_ok:
        return HINT_DV
    if dv_ok and not dk_ok:
        return HINT_DK
    if c.causal:
        return HINT_CAUSAL
    return None


# ---------------------------------------------------------------------------------------------
# one case against the oracle

def _naive_grads(c):
    """dK, dV by autograd of textbook attention in the inputs' dtype (the baseline)."""
    leaves = [t.detach().clone().requires_grad_() for t in (c.q, c.k, c.v)]
    out = attention_naive(*leaves, causal=c.causal)
    out.backward(c.do.to(out.dtype))
    return [torch.nan_to_num(t.grad.double(), nan=0.0).cpu() for t in leaves[1:]]


def _expect(impl, rng, shape_q, shape_kv, *, causal, dtype=torch.float32, q_scale=1.0,
            layouts="bhnd bhnd bhnd bhnd bhnd bhnd", zero_dout=False, blocks=SQUARE, record=False):
    kernel = _kernel(impl)
    c = _case(rng, shape_q, shape_kv, causal=causal, dtype=dtype, q_scale=q_scale,
              zero_dout=zero_dout, blocks=blocks)
    what = (f"{str(dtype)[6:]} q {tuple(shape_q)}, k and v {tuple(shape_kv)}, causal={causal}"
            + f", blocks {blocks[0]} x {blocks[1]}" + (", dO = 0" if zero_dout else "") + (f", q x {q_scale:g}" if q_scale != 1 else "")
            + ("" if layouts == "bhnd bhnd bhnd bhnd bhnd bhnd" else
               f", layouts q k v dO dK dV: {layouts}"))
    res = _run(kernel, c, layouts=layouts, record=record)
    diagnose = lambda: _diagnose(kernel, c, res) or "follow the docstring step by step"  # noqa: E731
    if res.changed_inputs:
        checks.fail(f"your kernel changed its inputs ({what})", "write only dK and dV")
    if res.wrote_outside:
        checks.fail(f"your kernel wrote outside dK[:, :, :Nk, :D] or dV ({what})", HINT_STORE)
    if res.stray:
        checks.fail(f"your kernel reads outside its inputs ({what}): " + "; ".join(res.stray),
                    HINT_READS)
    for name, got in (("dk", res.dk), ("dv", res.dv)):
        nan = torch.isnan(got)
        if nan.any():
            rows = nan.any(-1).nonzero()[:, -1].unique().tolist()
            checks.fail(f"{name} of {what} has NaN in key rows {rows[:8]}"
                        f"{' ...' if len(rows) > 8 else ''}", diagnose())
    if zero_dout:
        for name, got in (("dk", res.dk), ("dv", res.dv)):
            if got.abs().max() != 0:
                checks.fail(f"{name} of {what} is not exactly 0 (largest |{name}| "
                            f"{got.abs().max().item():.3g})", diagnose())
        return
    naive = _naive_grads(c)
    mags = attention_magnitudes(c.q64, c.k64, c.v64, c.do64, causal=causal)
    for n, (name, got, exp) in enumerate((("dk", res.dk, c.dk), ("dv", res.dv, c.dv))):
        checks.expect_close(got, exp.cpu(), name=f"{name} of {what}", dtype=dtype,
                            baseline=naive[n], hint=diagnose, magnitude=mags[name])


# ---------------------------------------------------------------------------------------------
# the checks

def check_ragged(impl, rng):
    """non-causal, ragged: Nq = 37, Nk = 50, head dims 16 and 32, 2 batches; blocks 32 x 32 and
    16 x 32 (BLOCK_M x BLOCK_N)"""
    _expect(impl, rng, (1, 2, 37, 16), (1, 2, 50, 16), causal=False)
    _expect(impl, rng, (2, 1, 37, 32), (2, 1, 50, 32), causal=False, blocks=TALL)


def check_causal(impl, rng):
    """causal, bottom-right: Nq < Nk (37 x 50, blocks 32 x 32 and 32 x 16), and Nq > Nk (50 x 37,
    blocks 16 x 32: rows 0-12 see no key, lse = -inf: their share is 0, no NaN)"""
    _expect(impl, rng, (1, 2, 37, 16), (1, 2, 50, 16), causal=True)
    _expect(impl, rng, (1, 1, 37, 16), (1, 1, 50, 16), causal=True, blocks=WIDE)
    _expect(impl, rng, (1, 1, 50, 16), (1, 1, 37, 16), causal=True, blocks=TALL)


def check_grouped_heads(impl, rng):
    """grouped-query: 4 query heads over 2 K/V heads, 2 batches, tensors laid out unlike Q;
    causal, and non-causal in float16; groups of 3 (6 over 2, causal, blocks 16 x 32) and 4 (4
    over 1, blocks 32 x 16)"""
    _expect(impl, rng, (2, 4, 37, 16), (2, 2, 50, 16), causal=True,
            layouts="bhnd bnhd hbnd nbhd bnhd hbnd")
    _expect(impl, rng, (1, 4, 21, 16), (1, 2, 40, 16), causal=False, dtype=torch.float16)
    _expect(impl, rng, (1, 6, 29, 16), (1, 2, 45, 16), causal=True, blocks=TALL)
    _expect(impl, rng, (1, 4, 21, 16), (1, 1, 40, 16), causal=False, blocks=WIDE)


def check_padded_head_dim(impl, rng):
    """head dim 24, padded to BLOCK_D = 32 (lanes 24-31 masked), causal 37 x 50"""
    _expect(impl, rng, (1, 2, 37, 24), (1, 2, 50, 24), causal=True)


def check_large_logits(impl, rng):
    """large logits: q x 30 (scores in the hundreds), causal 37 x 50"""
    _expect(impl, rng, (1, 2, 37, 16), (1, 2, 50, 16), causal=True, q_scale=30.0)


def check_zero_dout(impl, rng):
    """dO = 0 exactly: dK and dV exactly 0 (causal 50 x 37, rows with no key included)"""
    _expect(impl, rng, (1, 2, 50, 16), (1, 2, 37, 16), causal=True, zero_dout=True)


@checks.not_under_grade   # loads are seen only where the kernel runs: this process's interpreter
def check_reads(impl, rng):
    """every load stays inside its tensor, also the reads whose values never reach a store: causal
    50 x 37 and 37 x 50, head dim 24, 2 query heads over 1 K/V head, blocks 16 x 32 and 32 x 16"""
    _expect(impl, rng, (1, 2, 50, 24), (1, 1, 37, 24), causal=True, blocks=TALL, record=True)
    _expect(impl, rng, (1, 2, 37, 24), (1, 1, 50, 24), causal=True, blocks=WIDE, record=True)


CHECKS = [check_ragged, check_causal, check_grouped_heads, check_padded_head_dim,
          check_large_logits, check_zero_dout, check_reads]


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: your kernel, float16, 64 x 64 blocks, Nq = 1000, Nk = 1100, head
    dim 80, causal (2 batches, 8 query heads over 2 K/V heads)"""
    _expect(impl, rng, (2, 8, 1000, 80), (2, 2, 1100, 80), causal=True, dtype=torch.float16,
            blocks=(64, 64))


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex08b(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex08b_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
