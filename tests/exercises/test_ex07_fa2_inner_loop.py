"""Grader of exercise 07 (lesson 07): the Triton tile_update(acc, m_i, l_i, s, v, DOT_PRECISION).

First one update on a single tile (a small harness kernel below loads a mid-loop state, calls the
learner's function, stores the result) against the float64 formulas in base 2, including rows
whose scores are all -inf; then flashlib's FA2 forward kernel run with the learner's update
(``fa2_forward(..., tile_update=fn)``) against attention_ref under flashlib.testing's rule
(baseline: textbook attention in the same dtype, or flashlib's own kernel when that rounds more),
on irregular shapes: head dim 80, Nq != Nk, grouped heads (6 query heads over 2, 2 over 1), causal with
Nq > Nk (query rows with no key: out 0, lse -inf) and Nq < Nk, float32 and float16.
Probes name the mistake: acc or l not rescaled, block max instead of running max, exp instead of
exp2, NaN on fully masked rows, division by l inside the loop.
Through Triton's interpreter on a CPU the whole grader takes a few seconds.
"""
import inspect

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import KernelInterface

from flashlib.course import checks, grading
from flashlib import runtime
from flashlib.kernels.fa2_fwd import fa2_forward
from flashlib.kernels.tile import tile_update as library_update
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex07
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ("flashlib",)
# flashlib's own answer: removed from the copy of flashlib that `flashlib grade` shows the learner
FLASHLIB_ANSWERS = ("flashlib.kernels.tile.tile_update",)

DEV = runtime.DEVICE
BM, BN, BD = 32, 32, 64          # one tile: 32 query rows, 32 keys, head dim 64

HINT_NAN = ("a row whose scores are all -inf so far gives NaN: exp2(-inf - (-inf)) is NaN. Where "
            "m_new is -inf use 0 as the reference max (tl.where(m_new == float('-inf'), 0.0, "
            "m_new)) in alpha and p, so the row keeps m = -inf, l = 0, acc = 0")
HINT_RUNNING_MAX = ("m must be the running max, m_new = tl.maximum(m_i, tl.max(s, 1)), not the "
                    "max of this block alone")
HINT_EXP2 = ("s is already in base 2 (the kernel multiplied Q K^T by scale * log2(e)): use "
             "tl.math.exp2, not tl.exp, for alpha and p")
HINT_L = ("l is wrong although m is right: rescale l by alpha = exp2(m_i - m_new) before adding "
          "the row sums of p")
HINT_NORMALISED = ("your acc is divided by l: keep it unnormalised; the kernel divides by l once, "
                   "after the last block (deferred normalisation, FA2's saving)")
HINT_ACC = ("acc is wrong although m and l are right: rescale acc by alpha[:, None] before "
            "adding p @ v (tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION))")


# ---------------------------------------------------------------------------------------------
# the learner's function

def _update_fn(impl):
    """The learner's tile_update, checked to be a @triton.jit function that is not the stub."""
    fn = getattr(impl, "tile_update", None)
    if fn is None:
        checks.fail("your file defines no function tile_update: keep the name and signature "
                    "from the stub")
    if not isinstance(fn, KernelInterface):
        checks.fail("tile_update is a plain Python function: decorate it with @triton.jit, "
                    "since the FA2 kernel calls it from inside the kernel")
    source = inspect.getsource(getattr(fn, "fn", fn))
    if "raise NotImplementedError" in source:
        raise NotImplementedError("ex07: tile_update is still the stub")
    params = list(inspect.signature(getattr(fn, "fn", fn)).parameters)
    if len(params) != 6:
        checks.fail(f"tile_update takes {params}; keep the stub's signature "
                    "(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr)")
    return fn


# ---------------------------------------------------------------------------------------------
# one update on one tile

@triton.jit
def _one_step(Acc, M, L, S, V, AccOut, MOut, LOut,
              BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
              DOT_PRECISION: tl.constexpr, TILE_UPDATE: tl.constexpr):
    """Load a state and a tile (row-major, contiguous), apply TILE_UPDATE once, store."""
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    dims = tl.arange(0, BD)
    acc = tl.load(Acc + rows[:, None] * BD + dims[None, :])     # (BM, BD)
    m_i = tl.load(M + rows)                                     # (BM,)
    l_i = tl.load(L + rows)                                     # (BM,)
    s = tl.load(S + rows[:, None] * BN + cols[None, :])         # (BM, BN)
    v = tl.load(V + cols[:, None] * BD + dims[None, :])         # (BN, BD)
    acc, m_i, l_i = TILE_UPDATE(acc, m_i, l_i, s, v, DOT_PRECISION)
    tl.store(AccOut + rows[:, None] * BD + dims[None, :], acc)
    tl.store(MOut + rows, m_i)
    tl.store(LOut + rows, l_i)


def _run_step(fn, state):
    """state: float64 NumPy (acc, m, l, s, v) plus v's torch dtype -> (acc, m, l) as float64."""
    acc, m, l, s, v, v_dtype = state
    to_dev = lambda x, dt=torch.float32: torch.from_numpy(x).to(DEV, dt)  # noqa: E731
    outs = [torch.empty(BM, BD, device=DEV), torch.empty(BM, device=DEV), torch.empty(BM, device=DEV)]
    _one_step[(1,)](to_dev(acc), to_dev(m), to_dev(l), to_dev(s), to_dev(v, v_dtype), *outs,
                    BM=BM, BN=BN, BD=BD, DOT_PRECISION="ieee", TILE_UPDATE=fn)
    acc_out, m_out, l_out = (t.double().cpu().numpy() for t in outs)
    return m_out, l_out, acc_out


def _formulas(state, *, exp=lambda x: 2.0 ** x):
    """The update in float64 (base 2 unless told), guarding rows that are all -inf."""
    acc, m, l, s, v, v_dtype = state
    v = torch.from_numpy(v).to(v_dtype).double().numpy()  # the values the kernel sees
    m_new = np.maximum(m, s.max(axis=-1))
    ref = np.where(np.isneginf(m_new), 0.0, m_new)
    with np.errstate(all="ignore"):
        alpha = exp(m - ref)
        p = exp(s - ref[:, None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[:, None] * acc + p @ v


def _state(rng, v_dtype=torch.float32):
    """A mid-loop state in float32 values: some rows' running max above the block's, some below."""
    s = 3 * rng.standard_normal((BM, BN))
    m = s.max(axis=-1) + rng.uniform(-3, 3, BM)
    l = rng.uniform(0.5, 5, BM)
    acc = rng.standard_normal((BM, BD))
    v = rng.standard_normal((BN, BD))
    as32 = lambda x: x.astype(np.float32).astype(np.float64)  # noqa: E731
    return as32(acc), as32(m), as32(l), as32(s), as32(v), v_dtype


def _masked_state(rng):
    """Rows 0-2 all -inf from the start; rows 3-5 with a state but an all -inf block."""
    acc, m, l, s, v, v_dtype = _state(rng)
    s[:6] = -np.inf
    s[6, :BN // 2] = -np.inf                     # a partly masked row
    m[:3], l[:3], acc[:3] = -np.inf, 0.0, 0.0    # nothing seen yet
    return acc, m, l, s, v, v_dtype


def _close(a, b):
    return np.allclose(a, b, rtol=1e-4, atol=1e-5)


def _update_hint(state, got):
    """Which of m, l, acc is wrong, and the likely reason."""
    m, l, acc = got
    m_ref, l_ref, acc_ref = _formulas(state)
    if any(np.isnan(t).any() for t in got):
        return HINT_NAN
    if not _close(m, m_ref):
        return HINT_RUNNING_MAX
    if _close(l, _formulas(state, exp=np.exp)[1]):
        return HINT_EXP2
    if not _close(l, l_ref):
        return HINT_L
    acc_old, m_old, l_old = state[:3]
    alpha = 2.0 ** (m_old - np.where(np.isneginf(m_ref), 0.0, m_ref))  # (BM,)
    pv = acc_ref - alpha[:, None] * acc_old
    scale = np.where(l_ref > 0, l_ref, 1.0)[:, None]
    divided_once = acc_ref / scale                                       # (alpha acc + p v) / l
    fa1_style = ((alpha * l_old)[:, None] * acc_old + pv) / scale        # FA1's normalised O
    if _close(acc, divided_once) or _close(acc, fa1_style):
        return HINT_NORMALISED
    if not _close(acc, acc_ref):
        return HINT_ACC
    return None


def _diagnose(impl):
    """A hint from direct probes of the learner's update (used when the forward fails)."""
    try:
        fn = _update_fn(impl)
        rng = np.random.default_rng(7)
        masked, plain = _masked_state(rng), _state(rng)
        return _update_hint(masked, _run_step(fn, masked)) or _update_hint(plain, _run_step(fn, plain))
    except Exception:  # the probe itself failed: the check's own message says enough
        return None


def _expect_step(fn, state, what):
    got = _run_step(fn, state)
    expected = _formulas(state)
    baseline = _run_step(library_update, state)
    for name, g, e, b in zip(("m", "l", "acc"), got, expected, baseline):
        if np.isnan(g).any():
            rows = sorted(set(np.argwhere(np.isnan(g))[:, 0].tolist()))
            checks.fail(f"the new {name} has NaN in rows {rows} ({what})", HINT_NAN)
        checks.expect_close(g, e, baseline=b, dtype=np.dtype(np.float32),
                            name=f"the new {name} ({what})", hint=lambda: _update_hint(state, got))


def check_one_update(impl, rng):
    """one update on a 32 x 32 tile matches the formulas (float32 and float16 values)"""
    fn = _update_fn(impl)
    for v_dtype in (torch.float32, torch.float16):
        _expect_step(fn, _state(rng, v_dtype), f"one tile, {str(v_dtype)[6:]} values")


def check_masked_rows(impl, rng):
    """rows with only -inf scores keep m = -inf, l = 0, acc = 0, without NaN"""
    _expect_step(_update_fn(impl), _masked_state(rng), "rows 0-5 of this tile have only -inf scores")


HINT_EXPONENT = ("your update overflows where the maths does not: scores far from 0 (here rows "
                 "near 500 and near -30000, base 2) make exp2(s) inf. Every exponent must be a "
                 "difference that is <= 0, exp2(m_i - m_new) and exp2(s - m_new[:, None]), never "
                 "exp2(s) * exp2(-m_new); and no floor such as -1e4 on the reference max: "
                 "scores can lie below -1e4 (only -inf means masked)")


def _extreme_state(rng):
    """Rows 0-7: scores near 500 (past exp2's range), the running max 150 below (0-3) or 3 above
    (4-7); rows 8-15: near -3e4, below any -1e4 sentinel (8-11 with a state, 12-15 first block);
    the rest ordinary."""
    acc, m, l, s, v, v_dtype = _state(rng)
    base = np.zeros(BM)
    base[:8], base[8:16] = 500.0, -3e4
    s = s + base[:, None]
    m = s.max(axis=-1) + np.where(np.arange(BM) < 4, -150.0, 3.0) * (np.arange(BM) < 8) \
        + rng.uniform(-1, 1, BM)
    m[12:16], l[12:16], acc[12:16] = -np.inf, 0.0, 0.0
    as32 = lambda x: x.astype(np.float32).astype(np.float64)  # noqa: E731
    return as32(acc), as32(m), l, as32(s), v, v_dtype


def check_far_from_zero(impl, rng):
    """scores far from 0 (base 2: near 500, past exp2's range, and near -30000)"""
    fn = _update_fn(impl)
    state = _extreme_state(rng)
    got = _run_step(fn, state)
    for name, g, e, b in zip(("m", "l", "acc"), got, _formulas(state), _run_step(library_update, state)):
        checks.expect_close(g, e, baseline=b, dtype=np.dtype(np.float32),
                            name=f"the new {name} (rows near 500 and near -30000)",
                            hint=lambda: _diagnose(impl) or HINT_EXPONENT)


def check_dot_precision(impl, rng):
    """tl.dot uses the precision it is given (input_precision=DOT_PRECISION)"""
    import ast
    import textwrap

    fn = _update_fn(impl)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    param = list(inspect.signature(fn.fn).parameters)[5]
    dots = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and
            isinstance(n.func, ast.Attribute) and n.func.attr == "dot"]
    hint = (f"pass the precision the kernel gives you: tl.dot(p.to(v.dtype), v, acc, "
            f"input_precision={param}). The kernel asks for exact \"ieee\" float32 dots, or for "
            "TF32 when the caller allows it; Triton's interpreter ignores the precision, so only "
            "a GPU would show the difference")
    if not dots:
        checks.fail("tile_update computes p @ v without tl.dot", hint)
    for call in dots:
        given = {k.arg: k.value for k in call.keywords}
        value = given.get("input_precision")
        if not (isinstance(value, ast.Name) and value.id == param):
            what = "no input_precision" if value is None else f"input_precision={ast.unparse(value)}"
            checks.fail(f"your tl.dot call (line {call.lineno} of tile_update) has {what}", hint)


# ---------------------------------------------------------------------------------------------
# flashlib's FA2 kernel with the learner's update

def _naive_lse(q, k, causal):
    """logsumexp of the scaled scores in float32 (the lse baseline), -inf on empty rows."""
    q, k = q.float(), k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5                 # (B, Hq, Nq, Nk)
    if causal:
        Nq, Nk = q.shape[-2], k.shape[-2]
        allowed = torch.arange(Nk, device=q.device) <= torch.arange(Nq, device=q.device)[:, None] + Nk - Nq
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.logsumexp(s, dim=-1)


def _expect_forward(impl, rng, dtype, shape_q, shape_kv, causal):
    fn = _update_fn(impl)
    q, k, v = (torch.from_numpy(rng.standard_normal(shape)).to(DEV, dtype)
               for shape in (shape_q, shape_kv, shape_kv))
    with checks.inputs_kept("flashlib's FA2 kernel with your update", q=q, k=k, v=v) as kept:
        out, lse = fa2_forward(q, k, v, causal=causal, tile_update=fn)
    q, k, v = kept["q"], kept["k"], kept["v"]                # the references: from the copies
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    out_lib, lse_lib = fa2_forward(q, k, v, causal=causal)
    out_base = (attention_naive(q, k, v, causal=causal), out_lib)
    lse_base = (_naive_lse(q, k, causal), lse_lib)
    what = (f"flashlib's FA2 kernel with your update, {str(dtype)[6:]} q {tuple(shape_q)}, "
            f"k and v {tuple(shape_kv)}, causal={causal}")
    hint = lambda: _diagnose(impl) or "follow the update in the docstring"  # noqa: E731
    if torch.isnan(out).any():
        rows = torch.isnan(out).any(-1).nonzero()[:, -1].unique().tolist()
        checks.fail(f"out of {what} has NaN in query rows {rows[:8]}{' ...' if len(rows) > 8 else ''}",
                    hint())
    mags = attention_magnitudes(q, k, v, causal=causal)      # the rule's floor, from the inputs
    checks.expect_close(out.cpu(), out_ref.cpu(), baseline=out_base, dtype=dtype,
                        name=f"out of {what}", hint=hint, magnitude=mags["out"])
    checks.expect_close(lse.cpu(), lse_ref.cpu(), baseline=lse_base, dtype=torch.float32,
                        name=f"lse of {what}", hint=hint, magnitude=mags["lse"])


def check_fa2_forward(impl, rng):
    """FA2 with your update matches attention_ref (Nq != Nk, head dim 80, float32 and float16)"""
    for dtype in (torch.float32, torch.float16):
        _expect_forward(impl, rng, dtype, (1, 3, 97, 80), (1, 3, 130, 80), causal=False)


def check_fa2_causal(impl, rng):
    """causal, grouped heads, Nq > Nk (rows with no key: out 0, lse -inf) and Nq < Nk"""
    for dtype in (torch.float32, torch.float16):
        # rows 0-96 see no key; query block 64-127 mixes empty rows and rows with keys
        _expect_forward(impl, rng, dtype, (1, 6, 130, 80), (1, 2, 33, 80), causal=True)
        _expect_forward(impl, rng, dtype, (1, 2, 17, 80), (1, 1, 130, 80), causal=True)
    _expect_forward(impl, rng, torch.float32, (1, 2, 1, 16), (1, 2, 97, 16), causal=True)


CHECKS = [check_one_update, check_masked_rows, check_far_from_zero, check_dot_precision,
          check_fa2_forward, check_fa2_causal]


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: FA2 with your update, float16, N = 1000, head dim 128, causal
    (2 batches, 8 heads)"""
    _expect_forward(impl, rng, torch.float16, (2, 8, 1000, 128), (2, 8, 1000, 128), causal=True)


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex07(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex07_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
