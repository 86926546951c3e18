"""Grader of exercise 04 (lesson 04): fa2_tile_update(scores, v_block, m, l, acc) -> (m, l, acc).

First called directly (one update, against the float64 formulas, and on rows that are all -inf),
then plugged into flashlib.teach.tiled.fa2_forward(..., tile_update=fn) and compared with
attention_ref under flashlib.testing's rule (baseline: textbook attention in the same dtype, or
the library's own FA2 when that rounds more) on irregular shapes: 9 heads, head dim 80,
Nq != Nk, block sizes that do not divide N, causal with Nq > Nk (query rows with no key).
Probes name the mistake: no rescale of l or acc, block max instead of running max, division by
l inside the loop, NaN on fully masked rows.
"""
import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.reference import attention_ref
from flashlib.testing import attention_magnitudes
from flashlib.teach.tiled import fa2_forward, fa2_tile_update as library_update

pytestmark = pytest.mark.ex04
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is
# reached (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.teach.tiled.fa2_tile_update",)

DTYPES = (np.float32, np.float64)

HINT_NAN = ("a row whose scores are all -inf so far gives NaN: exp(-inf - (-inf)) is NaN. "
            "Where m_new is -inf use 0 as the reference max, so that alpha and P come out 0 "
            "and the row keeps m = -inf, l = 0, acc = 0")
HINT_RUNNING_MAX = ("m must be the running max, m_new = max(m_old, rowmax(scores)), not the "
                    "max of this block alone")


def _formulas(scores, v_block, m, l, acc):
    """The update in float64, guarding rows that are all -inf."""
    scores, v_block, m, l, acc = (np.asarray(t, np.float64) for t in (scores, v_block, m, l, acc))
    m_new = np.maximum(m, scores.max(axis=-1))
    ref = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m - ref)
    p = np.exp(scores - ref[..., None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block


def _call(impl, scores, v_block, m, l, acc):
    args = [t.copy() for t in (scores, v_block, m, l, acc)]
    result = checks.function(impl, "fa2_tile_update")(*args)
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        checks.fail(f"fa2_tile_update returned {type(result).__name__}; it should return the "
                    "triple (m, l, acc)")
    for name, before, after in zip(("scores", "v_block", "m", "l", "acc"),
                                   (scores, v_block, m, l, acc), args):
        if not np.array_equal(before, after):
            checks.fail(f"fa2_tile_update changed its argument {name} in place (e.g. acc *= "
                        "alpha): return new arrays instead; the caller may still need them")
    out = tuple(checks.as_array(t, name) for t, name in zip(result, ("m", "l", "acc")))
    for name, got, want in zip(("m", "l", "acc"), out, (m, l, acc)):
        if got.shape != want.shape:
            checks.fail(f"the new {name} has shape {got.shape}; expected {want.shape}, the "
                        f"shape of the {name} passed in")
        if got.dtype != want.dtype:
            checks.fail(f"the new {name} is {got.dtype} for {want.dtype} inputs: the docstring "
                        "promises the same dtype (no astype, no float64 constants)")
    return out


def _state(rng, dtype, lead=(2, 3), Bq=16, Bk=24, D=80):
    """A mid-loop state: some rows' running max above this block's max, some below."""
    scores = 2 * rng.standard_normal(lead + (Bq, Bk))
    v_block = rng.standard_normal(lead + (Bk, D))
    m = scores.max(axis=-1) + rng.uniform(-3, 3, lead + (Bq,))
    l = rng.uniform(0.5, 5, lead + (Bq,))
    acc = rng.standard_normal(lead + (Bq, D))
    return tuple(t.astype(dtype) for t in (scores, v_block, m, l, acc))


def _update_hint(state, got):
    """Which of m, l, acc is wrong, and the likely reason."""
    m, l, acc = got
    m_ref, l_ref, acc_ref = _formulas(*state)
    close = lambda a, b: np.allclose(a, b, rtol=1e-4, atol=1e-6)  # noqa: E731
    if np.isnan(m).any() or np.isnan(l).any() or np.isnan(acc).any():
        return HINT_NAN
    if not close(m, m_ref):
        return HINT_RUNNING_MAX
    if not close(l, l_ref):
        return ("l is wrong although m is right: did you rescale l by alpha = exp(m_old - m_new) "
                "before adding the row sums of P?")
    if close(acc, acc_ref / np.where(l_ref > 0, l_ref, 1.0)[..., None]):
        return ("your acc is divided by l: keep it unnormalised; fa2_forward divides by l once, "
                "after the last block (deferred normalisation, FA2's saving)")
    if not close(acc, acc_ref):
        return ("acc is wrong although m and l are right: did you rescale acc by "
                "alpha[..., None] before adding P @ v_block?")
    return None


def _masked_state(rng, dtype, D=80):
    """Rows 0-2 all -inf from the start; rows 3-5 with a state but an all -inf block."""
    scores, v_block, m, l, acc = _state(rng, np.float64, lead=(), Bq=8, Bk=12, D=D)
    scores[:6] = -np.inf
    scores[6, :5] = -np.inf                      # a partly masked row
    m[:3], l[:3], acc[:3] = -np.inf, 0.0, 0.0    # nothing seen yet
    return tuple(t.astype(dtype) for t in (scores, v_block, m, l, acc))


def _masked_hint(impl, rng, dtype=np.float64):
    state = _masked_state(rng, dtype)
    got = _call(impl, *state)
    if any(np.isnan(t).any() for t in got):
        return HINT_NAN
    return _update_hint(state, got)


def _diagnose(impl):
    rng = np.random.default_rng(5)
    state = _state(rng, np.float64)
    return _masked_hint(impl, rng) or _update_hint(state, _call(impl, *state))


def check_one_update(impl, rng):
    """one update matches the formulas (direct call, float32 and float64)"""
    for dtype in DTYPES:
        state = _state(rng, dtype)
        got = _call(impl, *state)
        expected = _formulas(*state)
        baseline = library_update(*state)
        for name, g, e, b in zip(("m", "l", "acc"), got, expected, baseline):
            checks.expect_close(g, e, baseline=b, dtype=np.dtype(dtype),
                                name=f"the new {name} ({dtype.__name__} scores of shape "
                                      f"{state[0].shape})",
                                hint=lambda: _update_hint(state, got))


def check_masked_rows(impl, rng):
    """rows with only -inf scores keep m = -inf, l = 0, acc = 0, without NaN"""
    for dtype in DTYPES:
        state = _masked_state(rng, dtype)
        got = _call(impl, *state)
        for name, g, e, b in zip(("m", "l", "acc"), got, _formulas(*state), library_update(*state)):
            if np.isnan(g).any():
                rows = sorted(set(np.argwhere(np.isnan(g))[:, 0].tolist()))
                checks.fail(f"the new {name} has NaN in rows {rows} (rows 0-5 of this block "
                            "have only -inf scores)", HINT_NAN)
            checks.expect_close(g, e, baseline=b, dtype=np.dtype(dtype),
                                name=f"the new {name} with fully masked rows",
                                hint=lambda: _update_hint(state, got))


HINT_EXPONENT = ("your update overflows where the maths does not: scores far from 0 (here "
                 "{where}) make exp(S) or exp(m) inf. Every exponent must be a difference that "
                 "is <= 0: alpha = exp(m_old - m_new), P = exp(S - m_new), never exp(S) / "
                 "exp(m_new) or exp(S) * exp(-m_new); and no floor such as -1e4 on the reference "
                 "max: scores can lie below -1e4 (only -inf means masked)")


def _extreme_state(rng, dtype, Bq=16, Bk=24, D=80):
    """Rows 0-3: scores ~2000 far above the running max; 4-7: the running max ~2000 above this
    block; 8-11: first block, scores ~ -3e4 (real scores below any -1e4 sentinel); 12-15: the
    same with a running state."""
    lead = (2, 3)
    scores = 2 * rng.standard_normal(lead + (Bq, Bk))
    offset = np.repeat([2000.0, 2000.0, -3e4, -3e4], 4)                  # (Bq,)
    scores = scores + offset[:, None]
    m = scores.max(axis=-1) + np.repeat([-150.0, 3.0, 0.0, 0.0], 4) + rng.uniform(-1, 1, lead + (Bq,))
    l = rng.uniform(0.5, 5, lead + (Bq,))
    acc = rng.standard_normal(lead + (Bq, D))
    m[..., 8:12], l[..., 8:12], acc[..., 8:12, :] = -np.inf, 0.0, 0.0
    v_block = rng.standard_normal(lead + (Bk, D))
    return tuple(t.astype(dtype) for t in (scores, v_block, m, l, acc))


def check_scores_far_from_zero(impl, rng):
    """scores in the thousands above and below 0 (past exp's range, below -1e4)"""
    for dtype in DTYPES:
        state = _extreme_state(rng, dtype)
        got = _call(impl, *state)
        where = "rows 0-7 near 2000, rows 8-15 near -30000"
        for name, g, e, b in zip(("m", "l", "acc"), got, _formulas(*state), library_update(*state)):
            checks.expect_close(g, e, baseline=b, dtype=np.dtype(dtype),
                                name=f"the new {name} ({dtype.__name__}, {where})",
                                hint=lambda: _diagnose(impl) or HINT_EXPONENT.format(where=where))


def _textbook(q, k, v, causal):
    """Naive attention in the inputs' dtype, empty rows -> out 0, lse -inf."""
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(D))   # (B, H, Nq, Nk)
    if causal:
        s = np.where(np.arange(Nk) <= np.arange(Nq)[:, None] + Nk - Nq, s, -np.inf)
    m = s.max(axis=-1)
    p = np.exp(s - np.where(np.isneginf(m), 0, m)[..., None])
    l = p.sum(axis=-1)
    out = (p @ v) / np.where(l > 0, l, 1)[..., None]
    return out, np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf)


def _expect_forward(impl, rng, dtype, shape_q, shape_k, block_q, block_k, causal):
    q = rng.standard_normal(shape_q).astype(dtype)
    k, v = (rng.standard_normal(shape_k).astype(dtype) for _ in range(2))
    fn = checks.function(impl, "fa2_tile_update")
    out, lse = fa2_forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal,
                           tile_update=fn)
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    out_b, lse_b = _textbook(q, k, v, causal)
    out_lib, lse_lib = fa2_forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    what = (f"fa2_forward with your update, {dtype.__name__} q {shape_q}, k and v {shape_k}, "
            f"block_q={block_q}, block_k={block_k}, causal={causal}")
    hint = lambda: _diagnose(impl) or "follow the update in the docstring"  # noqa: E731
    mags = attention_magnitudes(q, k, v, causal=causal)      # the rule's floor, from the inputs
    checks.expect_close(out, out_ref, baseline=(out_b, out_lib), dtype=np.dtype(dtype),
                        name=f"out of {what}", hint=hint, magnitude=mags["out"])
    checks.expect_close(lse, lse_ref, baseline=(lse_b, lse_lib), dtype=np.dtype(dtype),
                        name=f"lse of {what}", hint=hint, magnitude=mags["lse"])


def check_fa2_forward(impl, rng):
    """fa2_forward with your update matches attention_ref (blocks not dividing N)"""
    for dtype in DTYPES:
        block_q, block_k = [(16, 32), (32, 48), (64, 64)][rng.integers(3)]
        _expect_forward(impl, rng, dtype, (2, 3, 97, 80), (2, 3, 130, 80), block_q, block_k,
                        causal=False)


def check_fa2_causal(impl, rng):
    """causal, Nq > Nk (rows with no key: out = 0, lse = -inf) and Nq < Nk"""
    for dtype in DTYPES:
        _expect_forward(impl, rng, dtype, (1, 9, 130, 80), (1, 9, 97, 80), 32, 16, causal=True)
        _expect_forward(impl, rng, dtype, (1, 9, 17, 80), (1, 9, 130, 80), 16, 48, causal=True)


CHECKS = [check_one_update, check_masked_rows, check_scores_far_from_zero, check_fa2_forward,
          check_fa2_causal]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex04(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
