"""Grader of exercise 10 (lesson 10): combine_splits(out_parts, lse_parts) -> (out, lse).

Partial results come from real splits of attention (attention_ref over uneven chunks of the keys,
one chunk empty), merged and compared with attention_ref over all the keys; and from synthetic
lse values: far apart and in the thousands (past exp's range in float32 and float64), equal, a
single split, empty splits (-inf) mixed in and rows whose every split is empty (out 0, lse -inf).
float32 and float64, leading dims (batch, heads, tokens); rows whose lse lie far apart (so the
max must be each row's own, and the largest split of a row is not its first). The tolerance rule is flashlib.testing's
(baselines: the textbook merge in the same dtype, and the merge through the merged lse, weights
exp(lse_s - lse), whose rounding follows |lse|). Probes name the mistake: outputs averaged,
weights not normalised, base 2 instead of base e, max instead of log-sum-exp, no max
subtracted, NaN on empty rows, one max for every row, a reference other than the row's max.
"""
import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.reference import attention_ref

pytestmark = pytest.mark.ex10
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers, removed from the copy of flashlib that `flashlib grade` shows the
# learner (a call from the learner's file while graded is "not accepted"): the decode kernels'
# merge of the splits (the device function, its kernel and launcher) and the two-way lse merges
# a loop over the splits could fold (lesson 03's in NumPy, the ring's in torch)
FLASHLIB_ANSWERS = ("flashlib.kernels.decode.merge_splits",
                    "flashlib.kernels.decode._combine_kernel", "flashlib.kernels.decode.combine",
                    "flashlib.teach.tiled.merge_states", "flashlib.distributed.merge")

DTYPES = (np.float32, np.float64)

HINT_AVERAGE = ("your output looks like a plain average of the splits' outputs: weight split s by "
                "exp(lse_s - lse), so a split that holds more of the softmax's mass counts more")
HINT_NORMALISE = ("your weights do not sum to 1: divide sum_s exp(lse_s - m) * out_s by "
                  "sum_s exp(lse_s - m), i.e. weights exp(lse_s - lse) with lse the merged log-sum-exp")
HINT_BASE = ("lse_s is a natural log: use np.exp and np.log (base e), not exp2/log2 or powers of 2, "
             "for the weights and for the merged lse")
HINT_MAX = ("the merged lse is log(sum_s exp(lse_s)), the log-sum-exp of the splits' lse, not "
            "their max: lse = m + log(sum_s exp(lse_s - m))")
HINT_OVERFLOW = ("exp(lse_s) overflows: the lse_s can be in the thousands. Subtract the running "
                 "max m = max_s lse_s first, so every exponent lse_s - m is <= 0")
HINT_ROW_MAX = ("each row needs its own max, m = lse_parts.max(axis=-1, keepdims=True): with one "
                "max over the whole array (no axis), a row whose lse_s all lie more than 88.7 "
                "(float32) below another row's max has every exp(lse_s - m) underflow to 0 and "
                "looks empty")
HINT_LARGEST = ("subtract the largest lse_s of the row, not another split's (e.g. the first's): "
                "the weights cancel any reference on paper, but a split more than 88.7 (float32) "
                "or 709.8 (float64) above the reference makes exp(lse_s - ref) overflow to inf")
HINT_EMPTY = ("a row whose every split is empty (lse_s = -inf) must give out 0 and lse -inf, not "
              "NaN: exp(-inf - (-inf)) is NaN, so use 0 as the reference max when the max is -inf")


def _call(impl, out_parts, lse_parts):
    fn = checks.function(impl, "combine_splits")
    args = [out_parts.copy(), lse_parts.copy()]
    result = fn(*args)
    for name, before, after in zip(("out_parts", "lse_parts"), (out_parts, lse_parts), args):
        if not np.array_equal(before, after, equal_nan=True):
            checks.fail(f"combine_splits changed its argument {name} ({before.dtype}) in place "
                        "(e.g. lse_parts -= m): compute into new arrays; the caller may still "
                        "need it")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        checks.fail(f"combine_splits returned {type(result).__name__}; it should return the pair "
                    "(out, lse)")
    out, lse = (checks.as_array(t, name) for t, name in zip(result, ("out", "lse")))
    lead, D = lse_parts.shape[:-1], out_parts.shape[-1]
    if out.shape != (*lead, D):
        checks.fail(f"out has shape {out.shape}; expected {(*lead, D)}: sum over the split axis "
                    "(-2) of out_parts")
    if lse.shape != lead:
        checks.fail(f"lse has shape {lse.shape}; expected {lead}: one value per query row")
    for name, t in (("out", out), ("lse", lse)):
        if t.dtype != lse_parts.dtype:
            checks.fail(f"{name} is {t.dtype} for {lse_parts.dtype} inputs: the docstring "
                        "promises the inputs' dtype")
    return out, lse


def _merge64(out_parts, lse_parts):
    """The oracle: the merge in float64 through np.logaddexp (empty rows: 0 and -inf)."""
    o, l = out_parts.astype(np.float64), lse_parts.astype(np.float64)
    lse = np.logaddexp.reduce(l, axis=-1)                     # -inf where every split is empty
    finite = np.isfinite(lse)
    w = np.exp(l - np.where(finite, lse, 0.0)[..., None])     # 0 for empty splits and rows
    return (w[..., None] * o).sum(axis=-2), lse


def _textbook(out_parts, lse_parts):
    """The merge in the inputs' dtype (max subtracted): the tolerance baseline."""
    m = lse_parts.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0, m).astype(lse_parts.dtype)
    w = np.exp(lse_parts - m)
    total = w.sum(axis=-1)
    safe = np.where(total == 0, 1, total).astype(lse_parts.dtype)
    out = (w[..., None] * out_parts).sum(axis=-2) / safe[..., None]
    return out, np.where(total == 0, -np.inf, m[..., 0] + np.log(safe)).astype(lse_parts.dtype)


def _log_space(out_parts, lse_parts):
    """The merge in the inputs' dtype through the merged lse (flash-decoding's combine): lse by
    np.logaddexp, weights exp(lse_s - lse), which carry lse's rounding (ulps of |lse|, one
    rounding per split): the second baseline."""
    lse = np.logaddexp.reduce(lse_parts, axis=-1)                    # -inf where all empty
    w = np.exp(lse_parts - np.where(np.isneginf(lse), 0, lse).astype(lse_parts.dtype)[..., None])
    return (w[..., None] * out_parts).sum(axis=-2), lse


def _probe(impl, lse, dtype=np.float64):
    """Two splits with outputs e1, e2 (D=2) and the given lse: returns (out, lse) of the learner."""
    out_parts = np.eye(2, dtype=dtype)[None]                  # (1, 2 splits, 2)
    return _call(impl, out_parts, np.asarray([lse], dtype=dtype))


def _diagnose(impl):
    """Run small probes; return the first hint that fits, or None."""
    lse = [0.0, np.log(3.0)]                                  # the second split has 3x the mass
    out, merged = _probe(impl, lse)
    right = np.array([0.25, 0.75])
    if not np.allclose(out[0], right, rtol=1e-6):
        if np.allclose(out[0], [0.5, 0.5], rtol=1e-6):
            return HINT_AVERAGE
        if np.allclose(out[0], [1 / 3, 1.0], rtol=1e-6):
            return HINT_NORMALISE
        w2 = 2.0 ** np.array(lse)
        if np.allclose(out[0], w2 / w2.sum(), rtol=1e-6) or np.allclose(out[0], w2 / w2.max(), rtol=1e-6):
            return HINT_BASE
        return None
    if not np.allclose(merged[0], np.log(4.0), rtol=1e-6):
        if np.allclose(merged[0], np.log(3.0), rtol=1e-6):
            return HINT_MAX
        return HINT_BASE if np.allclose(merged[0], np.log(3.0) + np.log2(4 / 3), rtol=1e-6) else None
    for dtype, big in ((np.float32, 1000.0), (np.float64, 1000.0)):
        out, merged = _probe(impl, [big, big + np.log(3.0)], dtype)
        if not (np.all(np.isfinite(out)) and np.isfinite(merged[0])):
            return HINT_OVERFLOW
    out, merged = _probe(impl, [-np.inf, -np.inf])
    if np.isnan(out).any() or np.isnan(merged).any() or not np.isneginf(merged[0]):
        return HINT_EMPTY
    out, merged = _call(impl, np.stack([np.eye(2)] * 2).astype(np.float32),     # rows 300 apart
                        np.asarray([[0.0, np.log(3.0)], [-300.0, -300.0 + np.log(3.0)]], np.float32))
    if not (np.allclose(out[1], [0.25, 0.75], rtol=1e-5) and np.isfinite(merged[1])):
        return HINT_ROW_MAX
    out, merged = _probe(impl, [0.0, 200.0], np.float32)      # the second split 200 above the first
    if not (np.allclose(out[0], [0.0, 1.0], atol=1e-6) and np.isclose(merged[0], 200.0)):
        return HINT_LARGEST
    return None


def _expect(impl, out_parts, lse_parts, what, default_hint, *, expected=None, magnitude=None):
    """Compare the learner's merge with the oracle (or ``expected``) under the tolerance rule."""
    dtype = out_parts.dtype
    out, lse = _call(impl, out_parts, lse_parts)
    out_ref, lse_ref = _merge64(out_parts, lse_parts) if expected is None else expected
    out_b, lse_b = zip(_textbook(out_parts, lse_parts), _log_space(out_parts, lse_parts))
    hint = lambda: _diagnose(impl) or default_hint  # noqa: E731
    what = f"{dtype} out_parts {out_parts.shape}, {what}"
    if np.isnan(out).any() or np.isnan(lse).any():
        checks.fail(f"out or lse has NaN for {what}", hint())
    if not np.array_equal(np.isneginf(lse), np.isneginf(lse_ref)):
        checks.fail(f"lse for {what} is -inf in the wrong rows: exactly the rows whose every split "
                    "is empty have nothing to attend to", hint())
    mags = {} if magnitude is None else magnitude
    checks.expect_close(out, out_ref, baseline=out_b, dtype=dtype, name=f"out for {what}", hint=hint,
                        magnitude=mags.get("out"))
    checks.expect_close(lse, lse_ref, baseline=lse_b, dtype=dtype, name=f"lse for {what}", hint=hint,
                        magnitude=mags.get("lse"))


def _split_attention(rng, dtype, Nq, Nk, D, cuts, scale):
    """Partial results of real attention over the key chunks [cuts[i], cuts[i+1]) (float64,
    then rounded to dtype), and attention_ref over all the keys."""
    q, k, v = (rng.standard_normal(s) for s in ((1, 1, Nq, D), (1, 1, Nk, D), (1, 1, Nk, D)))
    outs, lses = [], []
    for a, b in zip(cuts, cuts[1:]):
        if a == b:                                            # an empty split
            outs.append(np.zeros((Nq, D)))
            lses.append(np.full(Nq, -np.inf))
            continue
        o, l = attention_ref(q, k[:, :, a:b], v[:, :, a:b], scale=scale)
        outs.append(o[0, 0])
        lses.append(l[0, 0])
    out_parts = np.stack(outs, axis=-2).astype(dtype)         # (Nq, S, D)
    lse_parts = np.stack(lses, axis=-1).astype(dtype)         # (Nq, S)
    ref, ref_lse = attention_ref(q, k, v, scale=scale)
    return out_parts, lse_parts, (ref[0, 0], ref_lse[0, 0])


def check_real_splits(impl, rng):
    """splits of real attention (uneven, one empty) merge into attention over all the keys"""
    for dtype in DTYPES:
        scale = float(rng.uniform(0.1, 0.4))
        cuts = [0, 1, 33, 33, 97, 130]
        out_parts, lse_parts, ref = _split_attention(rng, dtype, 17, 130, 80, cuts, scale)
        _expect(impl, out_parts, lse_parts, f"5 splits of 130 keys (cuts {cuts})",
                "out = sum_s exp(lse_s - lse) out_s with lse = log(sum_s exp(lse_s))", expected=ref)


def check_one_split(impl, rng):
    """a single split is returned unchanged"""
    for dtype in DTYPES:
        out_parts = rng.standard_normal((2, 5, 1, 16)).astype(dtype)
        lse_parts = rng.uniform(-5, 5, (2, 5, 1)).astype(dtype)
        _expect(impl, out_parts, lse_parts, "one split", "with one split, out = out_0, lse = lse_0")


def check_leading_dims(impl, rng):
    """any leading dims: (batch, heads, new tokens, splits, headdim)"""
    for dtype in DTYPES:
        out_parts = rng.standard_normal((2, 3, 4, 7, 16)).astype(dtype)
        lse_parts = rng.normal(0, 3, (2, 3, 4, 7)).astype(dtype)
        _expect(impl, out_parts, lse_parts, "random lse", "reduce over the split axis: -1 of "
                "lse_parts, -2 of out_parts")


def check_far_apart(impl, rng):
    """lse far apart and in the thousands (past exp's range) stay finite and right"""
    for dtype in DTYPES:
        base = 900 if dtype == np.float32 else 9000           # exp overflows past 88.7 / 709.8
        lse_parts = np.stack([rng.uniform(base, base + 3, 6), rng.uniform(base - 1, base + 1, 6),
                              rng.uniform(-base, -base + 50, 6), np.full(6, base + 40.0)], axis=-1)
        lse_parts[:3, 3] = base - 40.0                        # the 4th split dominates rows 3..5 only
        out_parts = rng.standard_normal((6, 4, 32))
        _expect(impl, out_parts.astype(dtype), lse_parts.astype(dtype), f"lse around {base}",
                "subtract the largest lse_s before exp")


def check_far_below_zero(impl, rng):
    """every lse far below 0 (near -30000, below any -1e4 stand-in), some splits empty"""
    for dtype in DTYPES:
        lse_parts = rng.uniform(-3e4 - 5, -3e4 + 5, (6, 5))
        lse_parts[::2, 1] = -np.inf
        out_parts = rng.standard_normal((6, 5, 16))
        out_parts[np.isneginf(lse_parts)] = 0.0
        # the rule's floor: a weight exp(lse_s - lse) is rounded at the scale of |lse_s|
        w = np.exp(lse_parts - np.logaddexp.reduce(lse_parts, axis=-1)[:, None])     # (6, 5)
        mags = {"out": float((w * (1 + np.abs(np.where(w > 0, lse_parts, 0)))
                              * np.abs(out_parts).max(-1)).sum(-1).max()),
                "lse": float(np.abs(lse_parts[np.isfinite(lse_parts)]).max())}
        _expect(impl, out_parts.astype(dtype), lse_parts.astype(dtype), "lse near -30000",
                magnitude=mags, default_hint=(
                "only -inf means an empty split: a reference max floored at a finite value such "
                "as -1e4 is larger than these lse, exp(lse_s - m) underflows to 0 and the row "
                "looks empty; use 0 as the reference only where the max is -inf"))


def check_rows_far_apart(impl, rng):
    """rows whose lse lie far apart (more than exp's range), the largest split not the first"""
    for dtype, gap in ((np.float32, 120.0), (np.float64, 800.0)):   # past 88.7 / 709.8
        jitter = rng.uniform(-2, 2, (6, 4))
        # per row: the first split a gap or more below the row's two largest (a few units apart,
        # so both count), the rows' maxima up to 5 gaps apart
        lse_parts = gap * np.array([[0, 1, 1, -0.5], [-1.5, -0.5, -2, -0.5], [0, -1, 1.5, 1.5],
                                    [-3, -2, -2, -3.5], [-1.5, 0.5, -np.inf, 0.5], [2, 3, 1, 3]])
        lse_parts = lse_parts + jitter
        out_parts = rng.standard_normal((6, 4, 16))
        out_parts[np.isneginf(lse_parts)] = 0.0
        _expect(impl, out_parts.astype(dtype), lse_parts.astype(dtype),
                f"lse of different rows up to {5 * gap:.0f} apart, each row's largest about "
                f"{gap:.0f} or more above its first split",
                "m = lse_parts.max(axis=-1, keepdims=True): the largest lse_s of each row")


def check_equal_lse(impl, rng):
    """equal lse give equal weights: the mean of the outputs"""
    for dtype in DTYPES:
        out_parts = rng.standard_normal((3, 5, 16)).astype(dtype)
        lse_parts = np.full((3, 5), rng.uniform(-2, 2)).astype(dtype)
        _expect(impl, out_parts, lse_parts, "all lse equal",
                "with equal lse_s, every split gets weight 1/S")


def check_empty_splits(impl, rng):
    """empty splits (lse -inf) get weight 0; rows with every split empty give out 0 and lse -inf"""
    for dtype in DTYPES:
        lse_parts = rng.normal(0, 4, (5, 6))
        lse_parts[0] = -np.inf                                # a row that sees no key at all
        lse_parts[1, 1:] = -np.inf                            # one split holds every key
        lse_parts[2:, ::2] = -np.inf                          # splits past the sequence's end
        out_parts = rng.standard_normal((5, 6, 24))
        out_parts[np.isneginf(lse_parts)] = 0.0               # an empty split's output is 0
        _expect(impl, out_parts.astype(dtype), lse_parts.astype(dtype), "empty splits (-inf)",
                "an empty split's weight exp(-inf - m) is 0; a row of empty splits gives 0, -inf")


CHECKS = [check_real_splits, check_one_split, check_leading_dims, check_far_apart, check_far_below_zero,
          check_rows_far_apart, check_equal_lse, check_empty_splits]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex10(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
