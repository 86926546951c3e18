"""Grader of exercise 06 (lesson 06): fa1_rescale(o, l, m, m_tilde, l_tilde, pv) -> (o, l, m),
a ``@triton.jit`` function for FlashAttention-1's Algorithm 1, lines 11-13.

First run on its own inside a small kernel (one update against the float64 formulas, then rows
that have seen no key), then plugged into flashlib.kernels.fa1.fa1_forward(..., rescale=fn) and
compared with attention_ref under flashlib.testing's rule (baseline: textbook attention in the
same dtype, or flashlib's own FA1 when that rounds more) on irregular shapes (small, for Triton's
interpreter): grouped heads (3 over 1), head dim 80, Nq != Nk, causal with Nq > Nk (query rows with no key). Probes name the
mistake: old O not rescaled, not un-normalised by l, no division by l_new, m~ in place of m_new,
l not rescaled, e instead of 2 as the base, NaN on rows with no key.
"""
import inspect

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashlib.course import checks, grading
from flashlib import runtime
from flashlib.kernels.fa1 import fa1_forward
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex06
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ("flashlib",)
# flashlib's own answer, removed from the copy of flashlib that `flashlib grade` shows the learner
# (a call from the learner's file while graded is "not accepted"): lines 11-13 are inside teach's
# NumPy FA1. The kernel's FA1 (kernels.fa1) stays: the grader runs it with the learner's update
# in the learner's process, and its tile_update step takes S and V, not the block statistics.
FLASHLIB_ANSWERS = ("flashlib.teach.tiled.fa1_forward",)

DTYPES = (torch.float32, torch.float16)
BM, BD = 16, 32

HINT_NAN = ("a row that has seen no key has m = -inf, and if this tile gives it none either, "
            "m_new = -inf and exp2(-inf - (-inf)) is NaN. Where m_new is -inf use 0 as the "
            "reference max in the exponents, and divide by 1 where l_new is 0, so the row keeps "
            "m = -inf, l = 0, O = 0")
HINTS = {
    "m_tilde_as_max": "m must be the running max, m_new = max(m, m~), not this tile's m~ alone",
    "m_tilde_in_exponents": ("the exponents must use m_new = max(m, m~): e^(m - m_new) and "
                             "e^(m~ - m_new), not e^(m - m~)"),
    "l_not_rescaled": ("l is wrong although m is right: did you rescale l? l_new = "
                       "e^(m - m_new) l + e^(m~ - m_new) l~"),
    "natural_exp": ("scores in flashlib's kernels are in base 2 (Q K^T was multiplied by "
                    "scale * log2(e)): use tl.math.exp2, not tl.exp"),
    "old_o_not_rescaled": ("the old O must be rescaled too: multiply it by e^(m - m_new) (and "
                           "by l) before adding e^(m~ - m_new) P~V"),
    "old_o_not_unnormalised": ("O is stored normalised: un-normalise it first, diag(l) O, "
                               "before rescaling it and adding the new block"),
    "no_division": ("O must come back normalised: divide by l_new (diag(l_new)^-1, line 12); "
                    "the next step, and the final output, read O as it is"),
    "new_block_not_rescaled": "the new block's P~V must be scaled by e^(m~ - m_new)",
}


@triton.jit
def _apply_kernel(O, L, M, MT, LT, PV, O_new, L_new, M_new,
                  BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, RESCALE: tl.constexpr):
    """Load one state and one tile's statistics, call RESCALE, store what it returns."""
    rows = tl.arange(0, BLOCK_M)
    tile = rows[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]   # (BM, BD)
    o, l, m = RESCALE(tl.load(O + tile), tl.load(L + rows), tl.load(M + rows),
                      tl.load(MT + rows), tl.load(LT + rows), tl.load(PV + tile))
    tl.store(O_new + tile, o)
    tl.store(L_new + rows, l)
    tl.store(M_new + rows, m)


def _rescale(impl):
    fn = checks.function(impl, "fa1_rescale")
    source = inspect.getsource(getattr(fn, "fn", fn))
    if "raise NotImplementedError" in source:
        raise NotImplementedError("fa1_rescale is still the stub")
    if not hasattr(fn, "fn"):
        checks.fail("fa1_rescale is a plain Python function: keep the @triton.jit decorator "
                    "from the stub (the kernel calls it on Triton tiles)")
    return fn


def _call(impl, state):
    """Run the learner's fa1_rescale on one state (float32 NumPy arrays); return (o, l, m)."""
    fn = _rescale(impl)
    args = [torch.from_numpy(np.ascontiguousarray(t, np.float32)).to(runtime.DEVICE) for t in state]
    o, l, m = (torch.empty_like(args[i]) for i in (0, 1, 2))
    _apply_kernel[(1,)](*args, o, l, m, BLOCK_M=BM, BLOCK_D=BD, RESCALE=fn)
    return tuple(t.cpu().numpy() for t in (o, l, m))


def _formulas(o, l, m, m_tilde, l_tilde, pv, *, mistake=None, dtype=np.float64):
    """Lines 11-13 with -inf guards, in ``dtype``; ``mistake`` makes one of the learners' slips."""
    o, l, m, m_tilde, l_tilde, pv = (np.asarray(t, dtype) for t in (o, l, m, m_tilde, l_tilde, pv))
    exp = np.exp if mistake == "natural_exp" else np.exp2
    m_new = m_tilde.copy() if mistake == "m_tilde_as_max" else np.maximum(m, m_tilde)
    ref = np.where(np.isneginf(m_new), 0.0, m_new)
    if mistake == "m_tilde_in_exponents":
        ref = np.where(np.isneginf(m_tilde), 0.0, m_tilde)
    with np.errstate(over="ignore", invalid="ignore"):
        old, new = exp(m - ref), exp(m_tilde - ref)
        l_new = (l if mistake == "l_not_rescaled" else old * l) + new * l_tilde
        weight = {"old_o_not_rescaled": l, "old_o_not_unnormalised": old}.get(mistake, l * old)
        new_pv = pv if mistake == "new_block_not_rescaled" else new[:, None] * pv
        o_new = weight[:, None] * o + new_pv
        if mistake != "no_division":
            o_new = o_new / np.where(l_new == 0, 1.0, l_new)[:, None]
    return o_new, l_new, m_new


def _state(rng):
    """A mid-loop state: rows with m above the tile's m~ and rows below, as float32."""
    m = rng.uniform(-4, 4, BM)
    m_tilde = m + rng.choice([-1, 1], BM) * rng.uniform(0.5, 3, BM)
    l, l_tilde = rng.uniform(1, 6, BM), rng.uniform(1, 6, BM)
    o = rng.standard_normal((BM, BD))
    pv = l_tilde[:, None] * rng.standard_normal((BM, BD))
    return tuple(t.astype(np.float32) for t in (o, l, m, m_tilde, l_tilde, pv))


def _masked_state(rng):
    """Rows 0-3: no key yet and none in this tile; 4-7: a history but nothing in this tile;
    8-11: the first keys arrive in this tile; the rest ordinary."""
    o, l, m, m_tilde, l_tilde, pv = (t.copy() for t in _state(rng))
    o[:4], l[:4], m[:4] = 0.0, 0.0, -np.inf
    m_tilde[:8], l_tilde[:8], pv[:8] = -np.inf, 0.0, 0.0
    o[8:12], l[8:12], m[8:12] = 0.0, 0.0, -np.inf
    return o, l, m, m_tilde, l_tilde, pv


def _close(a, b):
    return np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=False)


def _diagnose_state(state, got):
    if all(_close(g, w) for g, w in zip(got, _formulas(*state))):
        return None
    if any(np.isnan(t).any() for t in got):
        return HINT_NAN
    for mistake, hint in HINTS.items():
        if all(_close(g, w) for g, w in zip(got, _formulas(*state, mistake=mistake))):
            return hint
    o_ref, l_ref, m_ref = _formulas(*state)
    if not _close(got[2], m_ref):
        return HINTS["m_tilde_as_max"]
    if not _close(got[1], l_ref):
        return HINTS["l_not_rescaled"]
    return "O is wrong although l and m are right: follow line 12 of the docstring term by term"


def _diagnose(impl):
    rng = np.random.default_rng(6)
    masked = _masked_state(rng)
    got = _call(impl, masked)
    if any(np.isnan(t).any() for t in got):
        return HINT_NAN
    state = _state(rng)
    return _diagnose_state(state, _call(impl, state))


def _expect_update(impl, state, what):
    got = _call(impl, state)
    expected = _formulas(*state)
    baseline = _formulas(*state, dtype=np.float32)    # the same formulas, naively in float32
    for name, g, e, b in zip(("O", "l", "m"), got, expected, baseline):
        if np.isnan(g).any():
            rows = sorted(set(np.argwhere(np.isnan(g))[:, 0].tolist()))
            checks.fail(f"the new {name} has NaN in rows {rows} ({what})", HINT_NAN)
        checks.expect_close(g, e, baseline=b, dtype=np.dtype(np.float32),
                            name=f"the new {name} ({what})",
                            hint=lambda: _diagnose_state(state, got))


def check_one_update(impl, rng):
    """one update matches Algorithm 1 lines 11-13 (called on its own, float32)"""
    _expect_update(impl, _state(rng), "a state of 16 rows, some with m above m~, some below")


def check_masked_rows(impl, rng):
    """rows that have seen no key keep m = -inf, l = 0, O = 0, without NaN"""
    _expect_update(impl, _masked_state(rng), "rows 0-3 have seen no key, rows 0-7 none in "
                                             "this tile, rows 8-11 their first keys")


HINT_EXPONENT = ("your update overflows where the maths does not: m and m~ far from 0 (here "
                 "rows near 500 and near -30000, base 2) make exp2(m) inf. Every exponent must be "
                 "a difference that is <= 0, exp2(m - m_new) and exp2(m~ - m_new), never "
                 "exp2(m) / exp2(m_new); and no floor such as -1e4 on the reference max: "
                 "scores can lie below -1e4 (only -inf means masked)")


def _extreme_state(rng):
    """Rows 0-3: m near 500 and this tile's m~ 150 above; 4-7: m~ below m; 8-11: m and m~ near
    -3e4 (real scores below any -1e4 sentinel); 12-15: first keys, m~ near -3e4."""
    o, l, m, m_tilde, l_tilde, pv = (t.astype(np.float64) for t in _state(rng))
    base = np.repeat([500.0, 500.0, -3e4, -3e4], 4)
    m = base + rng.uniform(-2, 2, BM)
    m_tilde = m + np.repeat([150.0, -3.0, 0.0, 0.0], 4) + rng.uniform(-2, 2, BM)
    o[12:], l[12:], m[12:] = 0.0, 0.0, -np.inf
    return tuple(t.astype(np.float32) for t in (o, l, m, m_tilde, l_tilde, pv))


def check_far_from_zero(impl, rng):
    """m and m~ far from 0 (base 2: near 500, past exp2's range, and near -30000)"""
    state = _extreme_state(rng)
    got = _call(impl, state)
    for name, g, e, b in zip(("O", "l", "m"), got, _formulas(*state),
                             _formulas(*state, dtype=np.float32)):
        checks.expect_close(g, e, baseline=b, dtype=np.dtype(np.float32),
                            name=f"the new {name} (rows near 500 and near -30000)",
                            hint=lambda: _diagnose(impl) or HINT_EXPONENT)


def _tensors(rng, shape, dtype):
    return torch.from_numpy(rng.standard_normal(shape)).to(device=runtime.DEVICE, dtype=dtype)


def _np(t):
    return t.detach().cpu().to(torch.float64).numpy()


def _expect_forward(impl, rng, dtype, shape_q, shape_k, causal):
    fn = _rescale(impl)
    q, k, v = _tensors(rng, shape_q, dtype), _tensors(rng, shape_k, dtype), _tensors(rng, shape_k, dtype)
    out, lse = fa1_forward(q, k, v, causal=causal, rescale=fn)
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    out_lib, lse_lib = fa1_forward(q, k, v, causal=causal)
    out_naive = attention_naive(q, k, v, causal=causal)
    what = (f"fa1_forward with your rescale, {str(dtype).removeprefix('torch.')} q "
            f"{tuple(shape_q)}, k and v {tuple(shape_k)}, causal={causal}")
    hint = lambda: _diagnose(impl) or "follow lines 11-13 in the docstring"  # noqa: E731
    out_ref, lse_ref = _np(out_ref), _np(lse_ref)
    # the floor from the inputs (the size of the terms summed), as every attention grader: without
    # it the bar was 2x flashlib's own FA1, whose rounding a right update that orders its float32
    # operations differently (e.g. a reciprocal) matches only to within a factor near 2
    mags = attention_magnitudes(q, k, v, causal=causal)
    checks.expect_close(_np(out), out_ref, dtype=dtype, name=f"out of {what}", hint=hint,
                        baseline=(_np(out_naive), _np(out_lib)), magnitude=mags["out"])
    checks.expect_close(_np(lse), lse_ref, dtype=torch.float32, name=f"lse of {what}", hint=hint,
                        baseline=(_np(lse_lib), lse_ref.astype(np.float32)), magnitude=mags["lse"])


def check_fa1_forward(impl, rng):
    """fa1_forward with your update matches attention_ref (N not a multiple of the block)"""
    for dtype in DTYPES:
        _expect_forward(impl, rng, dtype, (1, 2, 97, 80), (1, 2, 130, 80), causal=False)


def check_fa1_causal(impl, rng):
    """causal with grouped heads, Nq > Nk (rows with no key: out = 0, lse = -inf) and Nq < Nk"""
    for dtype in DTYPES:
        _expect_forward(impl, rng, dtype, (1, 3, 130, 80), (1, 1, 97, 80), causal=True)
        _expect_forward(impl, rng, dtype, (1, 2, 17, 80), (1, 2, 130, 80), causal=True)


CHECKS = [check_one_update, check_masked_rows, check_far_from_zero, check_fa1_forward,
          check_fa1_causal]


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: fa1_forward with your rescale, float16, N = 1000, causal
    (2 batches, 4 heads, head dim 64)"""
    _expect_forward(impl, rng, torch.float16, (2, 4, 1000, 64), (2, 4, 1000, 64), causal=True)


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex06(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex06_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
