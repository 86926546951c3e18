"""Grader of exercise 08c (lesson 08): the FA2 backward's dQ kernel ``dq_kernel`` and
``FlashAttentionFn``, the autograd.Function that ties the backward together.

The kernel: the grader launches the learner's ``@triton.jit`` kernel itself (its own launcher
below, the stub's grid and arguments, the kernel called from a harness kernel of the grader's so
that its body is what runs in every program), through Triton's interpreter on a CPU, on small irregular
shapes: Nq != Nk, N not a multiple of the block, head dim 24 (padded to 32), several batches,
grouped heads (groups of 1, 2 and 4), tensors laid out unlike Q, causal on and off
(bottom-right, diagonal offset Nk - Nq not a multiple of the block; Nq > Nk gives rows with no
key, lse = -inf, whose dQ is 0), large logits, an all-zero dO (dQ exactly 0), float32 and
float16, and block shapes 32 x 32, 16 x 32 and 32 x 16. lse and delta = rowsum(dO * O) come from
attention_ref in float64 (stored as float32), as the forward and the launcher give them. dQ is
compared with torch.autograd through attention_ref in float64 under flashlib.testing's rule
(baseline: autograd of textbook attention in the inputs' dtype; magnitudes from
attention_magnitudes). Every tensor is a view into a larger buffer filled with NaN: a load
without its mask reads NaN, a store without its mask writes where the grader sees it; the
inputs must come back unchanged. One check (in this process only) records the address of every
load the interpreter runs: rows past Nq of Q and dO, and lse past the end, are wrong to read even
where the values are thrown away.

The Function (checks in this process only: autograd needs the learner's class here, not in
``flashlib grade``'s student process): ``FlashAttentionFn.apply`` with the grader's own forward
(attention_ref in float64, rounded to the inputs' dtype) and dK/dV launcher (float64 formulas
from the saved lse), both of which count their calls and refuse what flashlib's launchers
refuse, and with the file's ``attention_backward_dq`` wrapped in a spy (dq must come from the
learner's kernel, not from torch formulas that build the Nq x Nk matrix); gradients of q, k and v
against float64 autograd of attention_ref, with a loss that is not a sum, with ``out.sum()``
(autograd's dout is then expanded, every stride 0), views with a non-contiguous layout, float16,
an explicit scale, and only some inputs requiring grad. The Function's checks run only once the
kernel passes a probe in NaN buffers: it launches the kernel on tensors of their exact size.

A failing result is matched against plausible wrong formulas (lse left in natural log under
exp2, dQ scaled twice or not at all, delta left out, top-left or strict causal, the key loop
ending at the block's first row, K/V heads interleaved, the backward not causal or at the default
scale, dK and dV swapped) and small probes (NaN from K/V rows past Nk, from padded head dims,
from rows with no key), so the hint names the mistake. The whole grader takes seconds through
the interpreter.
"""
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

pytestmark = pytest.mark.ex08c
# what a learner's file may use of flashlib (the stub's imports)
FLASHLIB_ALLOWED = ("flashlib", "flashlib.runtime", "flashlib.runtime.INTERPRET")
# flashlib's own answer: calling it while graded is "not accepted"
FLASHLIB_ANSWERS = ("flashlib.kernels.fa2_bwd.dq_tile",)

DEV = runtime.DEVICE
BLOCKS = (32, 32)   # (BLOCK_M, BLOCK_N) through the interpreter, unless a check says otherwise
LOG2E = math.log2(math.e)
N_PARAMS = 33
PLAIN = "bhnd bhnd bhnd bhnd bhnd"   # layouts of q, k, v, dO, dQ

HINT_BASE2 = ("lse is a natural log: under exp2 both sides need the factor log2(e), P = "
              "exp2(S * LOG2E - lse * LOG2E) (S = scale * q.k); exp2(S * LOG2E - lse) is not P")
HINT_DQ_TWICE = ("dQ is scaled twice: dQ += scale * dS K, once. If your scores already carry "
                 "the scale (S = scale * q.k), dS does not: multiply dQ by scale once, at the end")
HINT_DQ_SCALE = ("dQ lacks the softmax scale: S = scale * Q K^T, so dQ = scale * sum dS K "
                 "(multiply once, e.g. dq * scale before the store)")
HINT_DELTA = ("dS = P * (dP - delta): you left out delta_i = rowsum(dO_i * O_i) (loaded from "
              "Delta, one float per query row, like lse)")
HINT_TOP_LEFT = ("causal here is bottom-right aligned: query i sees key j iff j <= i + Nk - Nq "
                 "(as in the forward, exercise 07b). Your mask is top-left (j <= i), which "
                 "differs when Nq != Nk; the end of the key loop moves with it too")
HINT_STRICT = ("causal is off by one: query i sees key j iff j <= i + Nk - Nq (the diagonal "
               "included: every row sees its own position), not j < i + Nk - Nq")
HINT_BAND = ("the key blocks that straddle the diagonal are used unmasked: ending the loop at the "
             "block's last visible key is not enough, P is 0 where j > i + Nk - Nq "
             "(tl.where(visible, ..., 0.0)) in every block you visit")
HINT_END = ("the key loop stops too early: the block's last row, pid_m * BLOCK_M + BLOCK_M - 1, "
            "sees keys up to that row + Nk - Nq, so the loop runs to "
            "min(pid_m * BLOCK_M + BLOCK_M + Nk - Nq, Nk) (not from the block's first row)")
HINT_CAUSAL = ("causal is wrong although non-causal is right: P is 0 where j > i + Nk - Nq "
               "(bottom-right), and the key loop must reach every key the block's last row sees: "
               "up to min(pid_m * BLOCK_M + BLOCK_M + Nk - Nq, Nk)")
HINT_GQA = ("grouped heads: query head h reads K/V head h // GROUP (GROUP consecutive query heads "
            "share one K/V head), not h % Hkv; Lse and Delta rows of head h start at "
            "(b * Hq + h) * Nq")
HINT_BLOCKS = ("right with square blocks, wrong with BLOCK_M != BLOCK_N: the key loop steps by "
               "BLOCK_N and its tiles are (BLOCK_M, BLOCK_N); the causal end counts query rows "
               "in BLOCK_M")
HINT_KEY_ROWS = ("K/V rows past Nk are read: when Nk is not a multiple of BLOCK_N the last key "
                 "block runs past the end of K and V. Load them with mask offs_n < Nk "
                 "(other=0.0) and set P to 0 on those columns")
HINT_HEAD_DIM = ("the padded head dims are read: with D = 24, BLOCK_D = 32 and lanes 24-31 lie "
                 "past each row. Mask offs_d < D on every load (other=0.0) and on the store")
HINT_EMPTY = ("rows with no visible key (causal with Nq > Nk) have lse = -inf: exp2(S - lse) "
              "is exp2(+inf) there, and exp2(-inf - (-inf)) is NaN. Zero P where the mask is "
              "False with tl.where(visible, exp2(...), 0.0) after the exp2, not -inf scores "
              "before it (or load such lse as +inf)")
HINT_STORE = ("dQ rows past Nq (or dims past D) were written: store with mask "
              "(offs_m[:, None] < Nq) & (offs_d[None, :] < D)")
HINT_READS = ("mask every load, also those whose values you would throw away: rows past Nq of "
              "Q and dO (offs_m < Nq), Lse and Delta past row Nq - 1, K and V rows past Nk, "
              "head dims past D. On a GPU an unmasked load past a tensor can fault")
HINT_SHAPES = ("a tl.dot's inner dims do not match: dP = dO V^T is (BM, BD) x (BD, BN) and dQ "
               "+= dS K is (BM, BN) x (BN, BD); with square blocks and BLOCK_D = BLOCK_N a "
               "wrong transpose runs, with other block shapes it cannot")

HINT_FN_NGRADS = ("backward returns one gradient per input of forward, in order: (dq, dk, dv, "
                  "None, None, None, None) for (q, k, v, causal, scale, forward, backward_dkdv)")
HINT_FN_ORDER = ("backward returns the gradients in the order of forward's inputs: dq (like q), "
                 "dk, dv (like k, v), then None for each non-tensor input")
HINT_FN_DOUT = ("dout comes with whatever strides autograd gives it (out.sum() sends an "
                "expanded tensor, every stride 0): dout = dout.contiguous() before launching")
HINT_FN_VIEWS = ("q, k and v may be views whose last dim is not contiguous: the launchers need "
                 "stride 1 there; make such inputs .contiguous() in forward, before running "
                 "forward and saving them")
HINT_FN_FORWARD = ("the backward must not run the forward again: forward saves q, k, v, out and "
                   "lse (ctx.save_for_backward(q, k, v, out, lse)), backward reads them from "
                   "ctx.saved_tensors")
HINT_FN_CAUSAL = ("the backward is not causal although the forward is: pass causal to both "
                  "launchers (keep it on ctx in forward)")
HINT_FN_SCALE = ("the backward uses the default scale 1/sqrt(D), not the one given: pass scale "
                 "to both launchers (keep it on ctx in forward)")
HINT_FN_SWAPPED = "dK and dV are swapped: backward_dkdv returns (dk, dv), in that order"
HINT_FN_NONE = ("a gradient is None for an input that requires grad: ctx.needs_input_grad[i] "
                "says whether input i (q = 0, k = 1, v = 2) needs one; or simply compute all three")
HINT_FN_DQ = ("dq is wrong while dk and dv are right: delta = rowsum(dout * out) in float32 (a "
              "(B, Hq, Nq) tensor), then attention_backward_dq(q, k, v, dout, lse, delta, "
              "causal=..., scale=...) with the saved q, k, v, out and lse (the kernel checks "
              "above test dq_kernel alone)")
HINT_FN_LAUNCH = ("the backward must compute dq with your kernel: attention_backward_dq(q, k, v, "
                  "dout, lse, delta, causal=..., scale=...) launches dq_kernel tile by tile; "
                  "torch formulas would build the Nq x Nk matrix the backward exists to avoid")
HINT_FN = ("follow the docstring: forward saves q, k, v, out, lse; backward makes dout "
           "contiguous, computes delta, launches attention_backward_dq and backward_dkdv with "
           "causal and scale, and returns (dq, dk, dv, None, None, None, None)")


# ---------------------------------------------------------------------------------------------
# the learner's kernel and the grader's launcher

def _kernel(impl):
    """The learner's dq_kernel (``checks.jit_kernel``)."""
    return checks.jit_kernel(impl, "dq_kernel", "ex08c", N_PARAMS)


def _block_d(d):
    return max(16, triton.next_power_of_2(d))


@triton.jit
def _harness(Q, K, V, dO, Lse, Delta, dQ, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh,
             stride_kn, stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
             stride_dqb, stride_dqh, stride_dqm, Hq, Nq, Nk, D, scale, GROUP, Ran,
             CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, KERNEL: tl.constexpr):
    """The learner's kernel (KERNEL) called as Triton code, so that its body is what runs in this
    program (a torch one-liner behind ``kernel[grid]`` does not); then the program marks its
    slot of Ran."""
    KERNEL(Q, K, V, dO, Lse, Delta, dQ, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh,
           stride_kn, stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
           stride_dqb, stride_dqh, stride_dqm, Hq, Nq, Nk, D, scale, GROUP, CAUSAL, BLOCK_M,
           BLOCK_N, BLOCK_D, DOT_PRECISION)
    tl.store(Ran + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), 1)


def _launch(kernel, q, k, v, do, lse, delta, dq, causal, blocks):
    """The stub's launch: grid (cdiv(Nq, BLOCK_M), B * Hq), ieee dots."""
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    grid = (triton.cdiv(Nq, blocks[0]), B * Hq)
    ran = torch.zeros(math.prod(grid), dtype=torch.int32, device=DEV)
    try:
        _harness[grid](
            q, k, v, do, lse, delta, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *do.stride()[:3], *dq.stride()[:3], Hq, Nq, k.shape[2], D, 1.0 / math.sqrt(D),
            Hq // Hkv, ran, CAUSAL=bool(causal), BLOCK_M=blocks[0], BLOCK_N=blocks[1],
            BLOCK_D=_block_d(D), DOT_PRECISION="ieee", num_warps=4, num_stages=1, KERNEL=kernel)
    except Exception as e:   # the interpreter's words for a tl.dot of mismatched tiles
        text = f"{type(e).__name__}: {e}"
        if "reduction dimensions" in text or ("dot" in text.lower() and "shape" in text.lower()):
            checks.fail(f"your kernel fails with BLOCK_M = {blocks[0]}, BLOCK_N = {blocks[1]}, "
                        f"BLOCK_D = {_block_d(D)}: {text.splitlines()[0][:300]}", HINT_SHAPES)
        raise
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    checks.expect_every_program_ran(ran, "dq_kernel", grid)


def _place(x, layout, pad):
    """x (B, H, N, D) copied into a view of a NaN buffer: N padded by ``pad``, D past BLOCK_D;
    the buffer's dims in ``layout`` order (e.g. "bnhd"). Returns (view, buf)."""
    B, H, N, D = x.shape
    sizes = dict(b=B, h=H, n=N + pad, d=_block_d(D) + 8)
    buf = torch.full([sizes[c] for c in layout], float("nan"), dtype=x.dtype, device=DEV)
    view = buf.permute(*[layout.index(c) for c in "bhnd"])[:, :, :N, :D]
    view.copy_(x)
    return view, buf


def _rows(x, pad):
    """x (B, H, N) float32 in a flat NaN buffer with ``pad`` NaN after it."""
    buf = torch.full((x.numel() + pad,), float("nan"), dtype=torch.float32, device=DEV)
    buf[:x.numel()] = x.reshape(-1)
    return buf[:x.numel()].view(x.shape), buf


def _run(kernel, case, *, layouts=PLAIN, blocks=BLOCKS, record=False):
    """Launch on ``case`` placed in NaN buffers. Returns a namespace with dq as a float64 CPU
    tensor, whether anything was written outside it or the inputs changed, and with ``record``
    the loads that read outside the inputs (phrases, or None where loads cannot be seen)."""
    pad = max(blocks)
    lq, lk, lv, ldo, ldq = layouts.split()
    placed = [_place(t, lay, pad) for t, lay in zip((case.q, case.k, case.v, case.do), (lq, lk, lv, ldo))]
    (lse, lse_buf), (delta, delta_buf) = _rows(case.lse, pad), _rows(case.delta, pad)
    bufs = [b for _, b in placed] + [lse_buf, delta_buf]
    inputs = [b.clone() for b in bufs]
    dqv, dqb = _place(torch.full_like(case.q, float("nan")), ldq, pad)
    views = [v for v, _ in placed]
    if record:
        with checks.loads_recorded() as loads:
            _launch(kernel, *views, lse, delta, dqv, case.causal, blocks)
    else:
        loads = None
        _launch(kernel, *views, lse, delta, dqv, case.causal, blocks)
    stray = None
    if loads is not None:
        named = [(name, view, buf, lay) for name, (view, buf), lay
                 in zip(("Q", "K", "V", "dO"), placed, (lq, lk, lv, ldo))]
        stray = _stray_loads(loads, named + [("Lse", lse, lse_buf, None),
                                             ("Delta", delta, delta_buf, None)])
    dq = dqv.detach().double().cpu()
    Nq, D = case.q.shape[2], case.q.shape[3]
    dqb[tuple(slice(None) if c in "bh" else slice(0, Nq if c == "n" else D) for c in ldq)] = float("nan")
    same = lambda a, b: torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())  # noqa: E731
    return types.SimpleNamespace(
        dq=dq, stray=stray, wrote_outside=bool((~torch.isnan(dqb)).any()),
        changed_inputs=not all(same(a, b) for a, b in zip(inputs, bufs)))


def _stray_loads(loads, tensors):
    """What the recorded loads read outside the views: a list of phrases such as "Q rows past
    Nq" (tensors: (name, view, buffer, layout) as placed by _place and _rows; layout None for
    the flat Lse and Delta), empty when every load stayed inside the inputs."""
    read = np.unique(np.concatenate(loads)) if loads else np.zeros(0, dtype=np.uint64)
    inside = np.concatenate([checks.element_addresses(view) for _, view, _, _ in tensors])
    stray, found = read[~np.isin(read, inside)], []
    for name, view, buf, layout in tensors:
        start, size = buf.data_ptr(), buf.element_size()
        mine = stray[(stray >= start) & (stray < start + buf.numel() * size)]
        if mine.size == 0:
            continue
        stray = stray[~np.isin(stray, mine)]
        if layout is None:
            found.append(f"{name} past its last row is loaded")
            continue
        where = dict(zip(layout, np.unravel_index(((mine - start) // size).astype(np.int64),
                                                  tuple(buf.shape))))
        n, d = view.shape[2], view.shape[3]
        if (where["n"] >= n).any():
            found.append(f"{name} rows past {'Nq' if name in ('Q', 'dO') else 'Nk'} are loaded "
                         f"(rows {int(where['n'][where['n'] >= n].min())}..{int(where['n'].max())})")
        if (where["d"] >= d).any():
            found.append(f"{name} head dims past D are loaded (dims {d}..{int(where['d'].max())})")
    if stray.size:
        found.append(f"{stray.size} elements outside the buffers of the inputs are loaded")
    return found


def _case(rng, shape_q, shape_kv, *, causal, dtype=torch.float32, q_scale=1.0, zero_dout=False):
    """Inputs, lse and delta (from attention_ref in float64) and the float64 dq."""
    q = q_scale * rng.standard_normal(shape_q)
    k, v = rng.standard_normal(shape_kv), rng.standard_normal(shape_kv)
    do = np.zeros(shape_q) if zero_dout else rng.standard_normal(shape_q)
    q, k, v, do = (torch.from_numpy(x).to(DEV, dtype) for x in (q, k, v, do))  # rounded inputs
    leaves = [t.clone().double().requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*leaves, causal=causal)
    out.backward(do.double())
    delta = (do.double() * out.detach()).sum(-1)
    return types.SimpleNamespace(
        q=q, k=k, v=v, do=do, causal=causal, dtype=dtype,
        lse=lse.detach().float(), delta=delta.float(),
        q64=leaves[0].detach(), k64=leaves[1].detach(), v64=leaves[2].detach(), do64=do.double(),
        lse64=lse.detach().float().double(), delta64=delta.float().double(), dq=leaves[0].grad)


def _close(a, b, tol=1e-3):
    a, b = (torch.as_tensor(t, dtype=torch.float64).cpu() for t in (a, b))
    return bool(((a == b) | (a - b).abs().le(tol * (1 + b.abs()))).all())


# ---------------------------------------------------------------------------------------------
# wrong formulas and probes: which mistake

def _formulas(c, *, blocks=BLOCKS, mask="bottom_right", base2=False, dq_factor=1.0, delta=True,
              kv_heads="grouped"):
    """dQ (float64) from the case's float32 lse and delta; the keywords build wrong ones."""
    q, k, v, do = c.q64, c.k64, c.v64, c.do64
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G, scale = Hq // Hkv, 1.0 / math.sqrt(D)
    heads = torch.arange(Hq, device=q.device)
    heads = heads // G if kv_heads == "grouped" else heads % Hkv
    kk, vv = k[:, heads], v[:, heads]                                         # (B, Hq, Nk, D)
    s = scale * q @ kk.transpose(-1, -2)                                      # (B, Hq, Nq, Nk)
    i, j = torch.arange(Nq, device=q.device)[:, None], torch.arange(Nk, device=q.device)[None, :]
    allowed = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    bm, bn = blocks
    off = Nk - Nq
    if c.causal:
        block_end = (i // bm * bm + bm + off).clamp(0, Nk)                    # the loop's end
        visited = j < (block_end + bn - 1) // bn * bn
        first_end = (i // bm * bm + 1 + off).clamp(0, Nk)
        allowed = {"bottom_right": j <= i + off, "strict": j < i + off, "top_left": j <= i,
                   "band": visited,
                   "end_first_row": (j <= i + off) & (j < (first_end + bn - 1) // bn * bn)}[mask]
    lse = c.lse64[..., None]
    expo = s * LOG2E - lse if base2 else s - lse
    p = torch.where(allowed, torch.exp2(expo) if base2 else torch.exp(expo), 0.0)
    dp = do @ vv.transpose(-1, -2)
    ds = p * (dp - c.delta64[..., None]) if delta else p * dp
    return dq_factor * scale * ds @ kk                                        # (B, Hq, Nq, D)


def _probe(kernel, shape_q, shape_kv, causal, blocks=BLOCKS):
    """(case, result, has NaN) of one small float32 probe."""
    c = _case(np.random.default_rng(5), shape_q, shape_kv, causal=causal)
    res = _run(kernel, c, blocks=blocks)
    return c, res, bool(torch.isnan(res.dq).any())


def _diagnose_nan(kernel):
    if _probe(kernel, (1, 1, 32, 16), (1, 1, 37, 16), False)[2]:
        return HINT_KEY_ROWS
    if _probe(kernel, (1, 1, 32, 24), (1, 1, 32, 24), False)[2]:
        return HINT_HEAD_DIM
    if _probe(kernel, (1, 1, 50, 16), (1, 1, 37, 16), True)[2]:
        return HINT_EMPTY
    return None


def _diagnose(kernel, c, res, blocks):
    """Name the likely mistake of result ``res`` on case ``c``, or None."""
    if torch.isnan(res.dq).any():
        return _diagnose_nan(kernel)
    if res.wrote_outside:
        return HINT_STORE
    scale = 1.0 / math.sqrt(c.q.shape[-1])
    wrong = [(dict(base2=True), HINT_BASE2), (dict(dq_factor=scale), HINT_DQ_TWICE),
             (dict(dq_factor=1 / scale), HINT_DQ_SCALE), (dict(delta=False), HINT_DELTA),
             (dict(kv_heads="interleaved"), HINT_GQA)]
    if c.causal:
        wrong += [(dict(mask="top_left"), HINT_TOP_LEFT), (dict(mask="strict"), HINT_STRICT),
                  (dict(mask="band"), HINT_BAND), (dict(mask="end_first_row"), HINT_END)]
    for kwargs, hint in wrong:
        if _close(res.dq, _formulas(c, blocks=blocks, **kwargs)):
            return hint
    try:   # a tile transposed wrongly runs only while BLOCK_N = BLOCK_D
        _run(kernel, c, blocks=(blocks[0], max(16, _block_d(c.q.shape[-1]) // 2)))
    except checks.CheckFailed as e:
        if HINT_SHAPES in str(e):
            return HINT_SHAPES
    if blocks[0] != blocks[1]:   # the same case right with square blocks: block sizes mixed up
        square = _run(kernel, c, blocks=(blocks[0], blocks[0]))
        if _close(square.dq, c.dq):
            return HINT_BLOCKS
    if c.causal:   # the same shapes right without the causal mask
        plain = _case(np.random.default_rng(6), tuple(c.q.shape), tuple(c.k.shape), causal=False)
        if _close(_run(kernel, plain, blocks=blocks).dq, plain.dq):
            return HINT_CAUSAL
    return None


# ---------------------------------------------------------------------------------------------
# one case against the oracle

def _naive_dq(c):
    """dQ by autograd of textbook attention in the inputs' dtype (the baseline)."""
    leaves = [t.detach().clone().requires_grad_() for t in (c.q, c.k, c.v)]
    out = attention_naive(*leaves, causal=c.causal)
    out.backward(c.do.to(out.dtype))
    return torch.nan_to_num(leaves[0].grad.double(), nan=0.0).cpu()


def _describe(c, layouts, blocks, q_scale, zero_dout):
    return (f"{str(c.dtype)[6:]} q {tuple(c.q.shape)}, k and v {tuple(c.k.shape)}, "
            f"causal={c.causal}, blocks {blocks[0]} x {blocks[1]}"
            + (", dO = 0" if zero_dout else "") + (f", q x {q_scale:g}" if q_scale != 1 else "")
            + ("" if layouts == PLAIN else f", layouts q k v dO dQ: {layouts}"))


def _expect(impl, rng, shape_q, shape_kv, *, causal, dtype=torch.float32, q_scale=1.0,
            layouts=PLAIN, zero_dout=False, blocks=BLOCKS):
    kernel = _kernel(impl)
    c = _case(rng, shape_q, shape_kv, causal=causal, dtype=dtype, q_scale=q_scale,
              zero_dout=zero_dout)
    what = _describe(c, layouts, blocks, q_scale, zero_dout)
    res = _run(kernel, c, layouts=layouts, blocks=blocks)
    diagnose = lambda: _diagnose(kernel, c, res, blocks) or "follow the docstring step by step"  # noqa: E731
    if res.changed_inputs:
        checks.fail(f"your kernel changed its inputs ({what})", "write only dQ")
    if res.wrote_outside:
        checks.fail(f"your kernel wrote outside dQ[:, :, :Nq, :D] ({what})", HINT_STORE)
    nan = torch.isnan(res.dq)
    if nan.any():
        rows = nan.any(-1).nonzero()[:, -1].unique().tolist()
        checks.fail(f"dq of {what} has NaN in query rows {rows[:8]}"
                    f"{' ...' if len(rows) > 8 else ''}", diagnose())
    if zero_dout:
        if res.dq.abs().max() != 0:
            checks.fail(f"dq of {what} is not exactly 0 (largest |dq| "
                        f"{res.dq.abs().max().item():.3g})", diagnose())
        return
    mags = attention_magnitudes(c.q64, c.k64, c.v64, c.do64, causal=causal)
    checks.expect_close(res.dq, c.dq.cpu(), name=f"dq of {what}", dtype=dtype,
                        baseline=_naive_dq(c), hint=diagnose, magnitude=mags["dq"])


# ---------------------------------------------------------------------------------------------
# the kernel's checks

def check_ragged(impl, rng):
    """non-causal, ragged: Nq = 37, Nk = 50 (blocks of 32), head dims 16 and 32, 2 batches"""
    _expect(impl, rng, (1, 2, 37, 16), (1, 2, 50, 16), causal=False)
    _expect(impl, rng, (2, 1, 37, 32), (2, 1, 50, 32), causal=False)


def check_causal(impl, rng):
    """causal, bottom-right: Nq < Nk (37 x 50), and Nq > Nk (50 x 37: rows 0-12 see no key,
    lse = -inf: their dQ is 0, no NaN)"""
    _expect(impl, rng, (1, 2, 37, 16), (1, 2, 50, 16), causal=True)
    _expect(impl, rng, (1, 1, 50, 16), (1, 1, 37, 16), causal=True)


def check_block_shapes(impl, rng):
    """blocks that are not square: BLOCK_M = 16 with BLOCK_N = 32, and 32 with 16 (causal,
    37 x 50 and 50 x 37, head dim 32)"""
    _expect(impl, rng, (1, 2, 37, 32), (1, 2, 50, 32), causal=True, blocks=(16, 32))
    _expect(impl, rng, (1, 2, 50, 32), (1, 2, 37, 32), causal=True, blocks=(32, 16))


def check_grouped_heads(impl, rng):
    """grouped-query: 4 query heads over 2 K/V heads (2 batches, tensors laid out unlike Q,
    causal), over 1 K/V head (float16), and over 4 (non-causal)"""
    _expect(impl, rng, (2, 4, 37, 16), (2, 2, 50, 16), causal=True,
            layouts="bnhd hbnd nbhd bnhd hbnd")
    _expect(impl, rng, (1, 4, 21, 16), (1, 1, 40, 16), causal=False, dtype=torch.float16)
    _expect(impl, rng, (1, 4, 21, 16), (1, 4, 40, 16), causal=False, blocks=(16, 32))


def check_padded_head_dim(impl, rng):
    """head dim 24, padded to BLOCK_D = 32 (lanes 24-31 masked), causal 37 x 50"""
    _expect(impl, rng, (1, 2, 37, 24), (1, 2, 50, 24), causal=True)


def check_large_logits(impl, rng):
    """large logits: q x 30 (scores in the hundreds), causal 37 x 50"""
    _expect(impl, rng, (1, 2, 37, 16), (1, 2, 50, 16), causal=True, q_scale=30.0)


def check_zero_dout(impl, rng):
    """dO = 0 exactly: dQ exactly 0 (causal 50 x 37, rows with no key included)"""
    _expect(impl, rng, (1, 2, 50, 16), (1, 2, 37, 16), causal=True, zero_dout=True)


@checks.not_under_grade   # loads are seen only where the kernel runs: this process's interpreter
def check_reads_inside(impl, rng):
    """every load stays inside Q, K, V, dO, Lse and Delta, even where its values would be thrown
    away (Nq = 37, Nk = 50, head dim 24 in BLOCK_D = 32; through the interpreter)"""
    kernel = _kernel(impl)
    c = _case(rng, (1, 2, 37, 24), (1, 2, 50, 24), causal=False)
    res = _run(kernel, c, record=True)
    if res.stray:
        checks.fail(f"your kernel reads outside its inputs ({_describe(c, PLAIN, BLOCKS, 1, False)}): "
                    + "; ".join(res.stray), HINT_READS)


CHECKS_KERNEL = [check_ragged, check_causal, check_block_shapes, check_grouped_heads,
                 check_padded_head_dim, check_large_logits, check_zero_dout, check_reads_inside]


# ---------------------------------------------------------------------------------------------
# the Function: the grader's forward and dK/dV launcher, counting their calls

def _last_dim_contiguous(**tensors):
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dim (stride 1), got strides "
                             f"{tuple(t.stride())}: pass {name}.contiguous()")


class _Launchers:
    """The forward and dK/dV launcher given to the learner's Function: float64 oracles rounded to
    the inputs' dtype, refusing what flashlib's launchers refuse, counting their calls."""

    def __init__(self):
        self.forwards, self.dkdvs = 0, 0

    def forward(self, q, k, v, *, causal, scale):
        self.forwards += 1
        _last_dim_contiguous(q=q, k=k, v=v)
        out, lse = attention_ref(q.detach().double(), k.detach().double(), v.detach().double(),
                                 causal=causal, scale=scale)
        return out.to(q.dtype), lse.float()

    def backward_dkdv(self, q, k, v, out, dout, lse, *, causal, scale):
        self.dkdvs += 1
        _last_dim_contiguous(q=q, k=k, v=v, dout=dout)
        B, Hq, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        if out.shape != q.shape or dout.shape != q.shape:
            raise ValueError(f"out {tuple(out.shape)} and dout {tuple(dout.shape)}: expected q's "
                             f"shape {tuple(q.shape)}")
        if lse.shape != (B, Hq, Nq) or lse.dtype != torch.float32:
            raise ValueError(f"lse {tuple(lse.shape)} {lse.dtype}: expected (B, Hq, Nq) = "
                             f"{(B, Hq, Nq)} float32, the forward's")
        G = Hq // Hkv
        scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
        q64, k64, v64, o64, do64 = (t.detach().double() for t in (q, k, v, out, dout))
        kk, vv = k64.repeat_interleave(G, 1), v64.repeat_interleave(G, 1)    # (B, Hq, Nk, D)
        s = scale * q64 @ kk.transpose(-1, -2)                               # (B, Hq, Nq, Nk)
        allowed = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
        if causal:
            i, j = torch.arange(Nq, device=q.device)[:, None], torch.arange(Nk, device=q.device)[None, :]
            allowed = j <= i + Nk - Nq
        p = torch.where(allowed, torch.exp(s - lse.double()[..., None]), 0.0)
        delta = (do64 * o64).sum(-1, keepdim=True)
        ds = p * (do64 @ vv.transpose(-1, -2) - delta)
        dk = (scale * ds.transpose(-1, -2) @ q64).reshape(B, Hkv, G, Nk, D).sum(2)
        dv = (p.transpose(-1, -2) @ do64).reshape(B, Hkv, G, Nk, D).sum(2)
        return dk.to(k.dtype), dv.to(v.dtype)


def _fn_formulas(q, k, v, dout, *, causal, scale, lse_causal=None, lse_scale=None):
    """dq, dk, dv (float64) of attention at (causal, scale), with P from the lse of the forward
    at (lse_causal, lse_scale) (default: the same): a backward run with other settings."""
    leaves = [t.detach().double() for t in (q, k, v)]
    lse_causal = causal if lse_causal is None else lse_causal
    lse_scale = scale if lse_scale is None else lse_scale
    out, lse = attention_ref(*leaves, causal=lse_causal, scale=lse_scale)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kk, vv = leaves[1].repeat_interleave(G, 1), leaves[2].repeat_interleave(G, 1)
    s = scale * leaves[0] @ kk.transpose(-1, -2)
    allowed = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    if causal:
        i, j = torch.arange(Nq, device=q.device)[:, None], torch.arange(Nk, device=q.device)[None, :]
        allowed = j <= i + Nk - Nq
    p = torch.where(allowed, torch.exp(s - lse[..., None]), 0.0)
    do = dout.double()
    ds = p * (do @ vv.transpose(-1, -2) - (do * out).sum(-1, keepdim=True))
    dq = scale * ds @ kk
    dk = (scale * ds.transpose(-1, -2) @ leaves[0]).reshape(B, Hkv, G, Nk, D).sum(2)
    dv = (p.transpose(-1, -2) @ do).reshape(B, Hkv, G, Nk, D).sum(2)
    return dq, dk, dv


def _fn(impl):
    cls = getattr(impl, "FlashAttentionFn", None)
    if cls is None:
        checks.fail("your file defines no FlashAttentionFn: keep the name from the stub")
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        checks.fail("FlashAttentionFn is not a torch.autograd.Function subclass: keep the stub's "
                    "class FlashAttentionFn(torch.autograd.Function)")
    return cls


def _kernel_first(impl):
    """The Function launches the learner's kernel on tensors of their exact size: a kernel that
    is wrong here, or stores outside dQ, would corrupt memory, so it must pass a probe first (in
    NaN buffers, with the launcher's 64 x 64 blocks)."""
    kernel = _kernel(impl)             # the kernel's stub says "not done" before anything runs
    c = _case(np.random.default_rng(7), (1, 2, 37, 16), (1, 1, 50, 16), causal=True)
    res = _run(kernel, c, blocks=(64, 64))
    if res.wrote_outside or res.changed_inputs or not _close(res.dq, c.dq):
        checks.fail("FlashAttentionFn launches your dq_kernel, which is wrong on a probe (causal "
                    "37 x 50, 64 x 64 blocks): fix the kernel first (the checks above)",
                    _diagnose(kernel, c, res, (64, 64)) or HINT_FN_DQ)


def _fn_error(e, what):
    """A CheckFailed naming the mistake behind an exception from the learner's Function."""
    text = str(e)
    if "incorrect number of gradients" in text:
        checks.fail(f"the backward of {what} fails: {text.splitlines()[0][:300]}", HINT_FN_NGRADS)
    if "invalid gradient at index" in text:
        checks.fail(f"the backward of {what} fails: {text.splitlines()[0][:300]}", HINT_FN_ORDER)
    if "dout needs a contiguous last dim" in text:
        checks.fail(f"the backward of {what} fails: {text.splitlines()[0][:300]}", HINT_FN_DOUT)
    if "needs a contiguous last dim" in text:
        checks.fail(f"{what} fails: {text.splitlines()[0][:300]}", HINT_FN_VIEWS)
    raise e


def _forward_backward(fn, leaves, causal, scale, launchers, weight, what):
    """fn.apply on ``leaves``, then (out * weight).sum() (or out.sum()) backward."""
    try:
        out = fn.apply(*leaves, causal, scale, launchers.forward, launchers.backward_dkdv)
    except (ValueError, RuntimeError) as e:
        _fn_error(e, what)
    if not isinstance(out, torch.Tensor) or out.shape != leaves[0].shape:
        checks.fail(f"{what} returns {type(out).__name__} "
                    f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}: expected out, "
                    f"a tensor shaped like q {tuple(leaves[0].shape)}", HINT_FN)
    if not out.requires_grad:
        checks.fail(f"the output of {what} does not require grad", HINT_FN)
    if launchers.forwards != 1:
        checks.fail(f"{what} ran the forward {launchers.forwards} times, expected once",
                    HINT_FN_FORWARD)
    try:
        (out if weight is None else out * weight).sum().backward()
    except (ValueError, RuntimeError) as e:
        _fn_error(e, what)
    if launchers.forwards != 1:
        checks.fail(f"the backward of {what} ran the forward again ({launchers.forwards} runs "
                    "in all)", HINT_FN_FORWARD)


def _expect_fn(impl, rng, shape_q, shape_kv, *, causal, dtype=torch.float32, scale=None,
               loss="weighted", views=("bhnd", "bhnd", "bhnd"), needs=(True, True, True)):
    """Run the learner's Function on fresh inputs (placed as ``views``: "bhnd", "bnhd" a
    transposed view, "strided" a view whose last dim has stride 2), take ``loss`` ("weighted":
    (out * w).sum(), or "sum") backward, and compare the gradients of the inputs that ``needs``
    with float64 autograd of attention_ref."""
    fn = _fn(impl)
    _kernel_first(impl)
    values = [rng.standard_normal(s) for s in (shape_q, shape_kv, shape_kv)]
    tensors = []
    for x, view in zip(values, views):
        t = torch.from_numpy(x).to(DEV, dtype)
        if view == "bnhd":
            t = t.transpose(1, 2).contiguous().transpose(1, 2)
        elif view == "strided":
            t = torch.stack([t, torch.full_like(t, float("nan"))], -1)[..., 0]
        tensors.append(t)
    leaves = [t.requires_grad_(need) for t, need in zip(tensors, needs)]
    kept = [t.detach().clone() for t in leaves]
    weight = torch.from_numpy(rng.standard_normal(shape_q)).to(DEV, dtype)
    launchers = _Launchers()
    what = (f"FlashAttentionFn.apply on {str(dtype)[6:]} q {tuple(shape_q)}, k and v "
            f"{tuple(shape_kv)}, causal={causal}, scale={scale}, loss "
            + ("(out * w).sum()" if loss == "weighted" else "out.sum()")
            + ("" if views == ("bhnd",) * 3 else f", q k v as views {' '.join(views)}")
            + ("" if all(needs) else ", requires_grad on "
               + " ".join(n for n, need in zip("qkv", needs) if need) + " only"))
    launcher = checks.function(impl, "attention_backward_dq")
    launches = []

    def spy(*args, **kwargs):     # the backward must launch the learner's kernel through it
        launches.append(1)
        return launcher(*args, **kwargs)

    impl.attention_backward_dq = spy
    try:
        _forward_backward(fn, leaves, causal, scale, launchers, weight if loss == "weighted" else None,
                          what)
    finally:
        impl.attention_backward_dq = launcher
    if needs[0] and leaves[0].grad is not None and not launches:
        checks.fail(f"the backward of {what} never calls attention_backward_dq", HINT_FN_LAUNCH)
    for name, t, before in zip("qkv", leaves, kept):
        now = t.detach()
        if not (torch.equal(now.isnan(), before.isnan()) and
                torch.equal(now.nan_to_num(), before.nan_to_num())):
            checks.fail(f"{what} changed its input {name} in place", "write only the output")
    dout = weight if loss == "weighted" else torch.ones(shape_q, dtype=dtype, device=DEV)
    # references from the copies taken before the call
    ref = _fn_formulas(*kept, dout, causal=causal, scale=scale)
    naive_leaves = [t.clone().requires_grad_() for t in kept]
    naive = torch.autograd.grad((attention_naive(*naive_leaves, causal=causal, scale=scale)
                                 * dout).sum(), naive_leaves)
    naive = [torch.nan_to_num(g.double(), nan=0.0).cpu() for g in naive]
    mags = attention_magnitudes(*[t.double() for t in kept], dout.double(), causal=causal,
                                scale=scale)
    grads = [t.grad for t in leaves]

    def diagnose(name):
        got = [None if g is None else g.double().cpu() for g in grads]
        wrong = [(dict(causal=False, lse_causal=causal), HINT_FN_CAUSAL),
                 (dict(causal=causal, scale=None, lse_scale=scale), HINT_FN_SCALE)]
        for kwargs, hint in wrong:
            alt = _fn_formulas(*kept, dout, **{"scale": scale, **kwargs})
            if all(g is None or _close(g, a) for g, a in zip(got, alt)) and \
                    (kwargs.get("causal") != causal or scale is not None):
                return hint
        if got[1] is not None and got[2] is not None and _close(got[1], ref[2]) and \
                _close(got[2], ref[1]):
            return HINT_FN_SWAPPED
        if all(g is None or _close(g, r) for g, r in zip(got[1:], ref[1:])) and got[0] is not None:
            return HINT_FN_DQ
        return HINT_FN

    for n, (name, g, need) in enumerate(zip(("dq", "dk", "dv"), grads, needs)):
        if not need:
            continue
        if g is None:
            checks.fail(f"{name} of {what} is None: {'qkv'[n]}.grad was not set", HINT_FN_NONE)
        if g.shape != leaves[n].shape:
            checks.fail(f"{name} of {what} has shape {tuple(g.shape)}, expected "
                        f"{tuple(leaves[n].shape)}", HINT_FN_ORDER)
        checks.expect_close(g.detach().double().cpu(), ref[n].cpu(), name=f"{name} of {what}",
                            dtype=dtype, baseline=naive[n], hint=lambda name=name: diagnose(name),
                            magnitude=mags[name])


# ---------------------------------------------------------------------------------------------
# the Function's checks (autograd needs the learner's class in this process)

@checks.not_under_grade   # autograd needs the learner's Function in this process
def check_function_gradients(impl, rng):
    """FlashAttentionFn: dq, dk, dv of a weighted loss against float64 autograd (causal 37 x 50,
    4 query heads over 2 K/V heads, head dim 24, scale 0.3; non-causal float16 21 x 40)"""
    _expect_fn(impl, rng, (2, 4, 37, 24), (2, 2, 50, 24), causal=True, scale=0.3)
    _expect_fn(impl, rng, (1, 2, 21, 16), (1, 1, 40, 16), causal=False, dtype=torch.float16)


@checks.not_under_grade   # autograd needs the learner's Function in this process
def check_function_views(impl, rng):
    """FlashAttentionFn with loss out.sum() (autograd's dout is expanded, every stride 0) on
    views: q transposed from (B, N, H, D), k with its last dim strided; causal 50 x 37 (rows with
    no key get dq = 0)"""
    _expect_fn(impl, rng, (1, 2, 50, 16), (1, 2, 37, 16), causal=True, loss="sum",
               views=("bnhd", "strided", "bhnd"))


@checks.not_under_grade   # autograd needs the learner's Function in this process
def check_function_some_inputs(impl, rng):
    """FlashAttentionFn where only q requires grad, then only k and v (causal 37 x 50)"""
    _expect_fn(impl, rng, (1, 2, 37, 16), (1, 1, 50, 16), causal=True, needs=(True, False, False))
    _expect_fn(impl, rng, (1, 2, 37, 16), (1, 1, 50, 16), causal=True, needs=(False, True, True))


CHECKS = CHECKS_KERNEL + [check_function_gradients, check_function_views,
                          check_function_some_inputs]


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: your kernel, float16, 64 x 64 blocks, Nq = 1000, Nk = 1100, head
    dim 80, causal (2 batches, 8 query heads over 2 K/V heads)"""
    _expect(impl, rng, (2, 8, 1000, 80), (2, 2, 1100, 80), causal=True, dtype=torch.float16,
            blocks=(64, 64))


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex08c(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex08c_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
