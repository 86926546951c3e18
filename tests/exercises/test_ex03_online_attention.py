"""Grader of exercise 03 (lesson 03): online_attention(q, k, v, *, scale=None) -> (out, lse).

out and lse are compared with attention_ref (float64) under flashlib.testing's rule, baseline
the textbook attention in the same dtype (or flashlib.teach.tiled.online_attention when that rounds
more), for Nq != Nk, head dim 80, float32 and float64, and for keys built so that the scores are
all equal, grow from key to key, or lie further apart than exp's range. Small probes name the
mistake: scale left out, output normalised too early, accumulator not rescaled, running max
not kept, lse without the max.
"""
import math

import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.reference import attention_ref
from flashlib.testing import attention_magnitudes
from flashlib.teach.tiled import online_attention as library_attention

pytestmark = pytest.mark.ex03
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is
# reached (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.teach.tiled.online_attention",
                    "flashlib.teach.tiled.standard_attention",
                    "flashlib.reference.attention_ref")

DTYPES = (np.float32, np.float64)


def _reference(q, k, v, scale):
    out, lse = attention_ref(q[None, None], k[None, None], v[None, None], scale=scale)
    return out[0, 0], lse[0, 0]


def _textbook(q, k, v, scale):
    """Naive attention in the inputs' dtype: the tolerance baseline."""
    s = (q @ k.T) * q.dtype.type(scale)                  # (Nq, Nk)
    m = s.max(axis=-1)
    p = np.exp(s - m[:, None])
    l = p.sum(axis=-1)
    return (p @ v) / l[:, None], m + np.log(l)


def _call(impl, q, k, v, **kwargs):
    args = [q.copy(), k.copy(), v.copy()]
    result = checks.function(impl, "online_attention")(*args, **kwargs)
    for name, before, after in zip("qkv", (q, k, v), args):
        if not np.array_equal(before, after):
            checks.fail(f"online_attention changed its argument {name} ({before.dtype}) in place "
                        "(e.g. q *= scale): compute into new arrays (qs = q * scale); the caller "
                        "may still need it")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        checks.fail(f"online_attention returned {type(result).__name__}; it should return "
                    "the pair (out, lse)")
    out, lse = (checks.as_array(t, name) for t, name in zip(result, ("out", "lse")))
    if out.shape != q.shape:
        checks.fail(f"out has shape {out.shape}; expected q's shape {q.shape}")
    if lse.shape != q.shape[:1]:
        checks.fail(f"lse has shape {lse.shape}; expected ({q.shape[0]},), one value per "
                    "query row")
    for name, t in (("out", out), ("lse", lse)):
        if t.dtype != q.dtype:
            checks.fail(f"{name} is {t.dtype} for {q.dtype} inputs: the docstring promises q's "
                        "dtype (start from the stub's m, l and acc; no astype, no float64 "
                        "constants)")
    return out, lse


def _probe_inputs(kind, dtype=np.float64, Nq=5, Nk=9, D=8, scale=1.0):
    """Small q, k, v whose scores (with ``scale``) are equal / growing / far apart per row."""
    rng = np.random.default_rng(4)
    v = rng.standard_normal((Nk, D))
    u = rng.standard_normal(D)
    u /= np.linalg.norm(u)
    a = 1 + 0.1 * np.arange(Nq)                            # q . u > 0 for every row
    q = a[:, None] * u + 0.01 * rng.standard_normal((Nq, D))
    if kind == "random":
        q, k = rng.standard_normal((Nq, D)), rng.standard_normal((Nk, D))
    elif kind == "equal":
        k = np.tile(rng.standard_normal(D), (Nk, 1))       # every key alike: equal scores
    elif kind == "growing":
        k = np.linspace(-3, 3, Nk)[:, None] * u
    else:                                                  # "apart": +-2 * overflow, max first
        k = np.linspace(1, -1, Nk)[:, None] * u * (180 if dtype == np.float32 else 1400) / scale
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _wrong(impl, kind, dtype=np.float64, scale=1.0):
    q, k, v = _probe_inputs(kind, dtype, scale=scale)
    out, _ = _call(impl, q, k, v, scale=scale)
    return not np.allclose(out, _reference(q, k, v, scale)[0], rtol=1e-4, atol=1e-6)


def _diagnose(impl):
    """Run small probes; return the first hint that fits, or None."""
    q, k, v = _probe_inputs("random")
    out, _ = _call(impl, q, k, v, scale=0.5)
    if not np.allclose(out, _reference(q, k, v, 0.5)[0], rtol=1e-6):
        if np.allclose(out, _reference(q, k, v, 1.0)[0], rtol=1e-6):
            return ("your scores are not scaled: s = scale * (q . k_j), with scale = "
                    "1/sqrt(D) when it is None")
        if np.allclose(out, _reference(q, k, v, 1 / math.sqrt(q.shape[1]))[0], rtol=1e-6):
            return "you ignore the scale argument: use it when given, 1/sqrt(D) only when None"
    if _wrong(impl, "equal"):
        return ("with equal scores the output must be the mean of v, and yours is not: keep acc "
                "unnormalised (a running sum of exp(s - m) * v) and divide by l once, at the "
                "end, not at every key")
    if _wrong(impl, "growing"):
        return ("your output is wrong when the max grows from key to key: did you rescale acc "
                "by alpha = exp(m_old - m_new), like l?")
    if _wrong(impl, "apart", np.float32):
        return ("overflows when the scores are far apart: keep the running max, m_new = "
                "max(m_old, s_j), so that every exponent (s - m_new, m_old - m_new) is <= 0")
    q, k, v = _probe_inputs("random")
    _, lse = _call(impl, q, k, v, scale=1.0)
    lse_ref = _reference(q, k, v, 1.0)[1]
    if np.allclose(lse, lse_ref - (q @ k.T).max(axis=-1), rtol=1e-6):
        return ("your lse is log(l) alone, but l is a sum of exp(s - m): add the running max "
                "back, lse = m + log(l)")
    if not np.allclose(lse, lse_ref, rtol=1e-6):
        return "after the last key, lse = m + log(l) (natural log)"
    return None


def _expect(impl, q, k, v, scale, what, default_hint, *, check_lse=False):
    kwargs = {} if scale is None else {"scale": scale}
    out, lse = _call(impl, q, k, v, **kwargs)
    scale = 1 / math.sqrt(q.shape[1]) if scale is None else scale
    out_ref, lse_ref = _reference(q, k, v, scale)
    out_b, lse_b = _textbook(q, k, v, scale)
    out_lib, lse_lib = library_attention(q, k, v, scale=scale)
    hint = lambda: _diagnose(impl) or default_hint  # noqa: E731
    mags = attention_magnitudes(q[None, None], k[None, None], v[None, None], scale=scale)
    what = f"{q.dtype} q {q.shape}, k and v {k.shape}, {what}"
    checks.expect_close(out, out_ref, baseline=(out_b, out_lib), dtype=q.dtype,
                        name=f"out for {what}", hint=hint, magnitude=mags["out"])
    if check_lse:
        baseline = (lse_b, lse_lib)
        checks.expect_close(lse, lse_ref, baseline=baseline, dtype=q.dtype,
                            name=f"lse for {what}", hint=hint, magnitude=mags["lse"])


def _random(rng, dtype, Nq, Nk, D=80):
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((Nq, D), (Nk, D), (Nk, D)))


def check_random(impl, rng):
    """out matches attention_ref on random inputs (float32 and float64, Nq != Nk, D = 80)"""
    for dtype in DTYPES:
        for Nq, Nk in ((17, 130), (1, 97), (97, 1)):
            scale = float(rng.uniform(0.1, 0.4))
            _expect(impl, *_random(rng, dtype, Nq, Nk), scale, f"scale={scale:.3f}",
                    "follow the recurrence in the docstring")


def check_lse(impl, rng):
    """lse is the log-sum-exp of each row of scale * q @ k.T"""
    for dtype in DTYPES:
        scale = float(rng.uniform(0.1, 0.4))
        _expect(impl, *_random(rng, dtype, 17, 97), scale, f"scale={scale:.3f}",
                "lse = m + log(l) after the last key", check_lse=True)


def check_default_scale(impl, rng):
    """scale=None means 1/sqrt(D)"""
    for dtype in DTYPES:
        _expect(impl, *_random(rng, dtype, 9, 33), None, "scale=None",
                "when scale is None use 1/sqrt(D), D = q.shape[1]", check_lse=True)


def _structured(rng, kind, dtype, scale):
    q, k, v = _probe_inputs(kind, dtype, Nq=17, Nk=97, D=80, scale=scale)
    noise = rng.uniform(0.9, 1.1)                          # fresh inputs every run
    return q * dtype(noise), k, v + dtype(rng.standard_normal())


def check_equal_scores(impl, rng):
    """identical keys give the mean of v (normalise once, at the end)"""
    for dtype in DTYPES:
        _expect(impl, *_structured(rng, "equal", dtype, 0.2), 0.2, "all scores equal",
                "with equal scores, out is the mean of v")


def check_growing_scores(impl, rng):
    """scores that grow from key to key: l and acc are rescaled"""
    for dtype in DTYPES:
        _expect(impl, *_structured(rng, "growing", dtype, 0.5), 0.5, "scores growing",
                "rescale l and acc by exp(m_old - m_new) when the max grows", check_lse=True)


def check_scores_far_apart(impl, rng):
    """scores further apart than exp's range (past 88.72 in float32) stay finite"""
    for dtype in DTYPES:
        q, k, v = _structured(rng, "apart", dtype, 1.0)
        for order in (slice(None), slice(None, None, -1)):   # max first, then max last
            # copies: attention_ref cannot take NumPy views with negative strides
            _expect(impl, q, k[order].copy(), v[order].copy(), 1.0,
                    "scores spread beyond exp's range",
                    "subtract the running max: every exponent must be <= 0", check_lse=True)


def check_scores_far_below_zero(impl, rng):
    """every score far below 0 (about -1000): the running max starts at -inf, not 0"""
    for dtype in DTYPES:
        Nq, Nk, D = 9, 33, 32
        q = 1 + 0.1 * rng.standard_normal((Nq, D))
        k = -30 + 0.5 * rng.standard_normal((Nk, D))
        v = rng.standard_normal((Nk, D))
        out, _ = _call(impl, *(t.astype(dtype) for t in (q, k, v)), scale=1.0)
        hint = None
        if not np.all(np.isfinite(out)):
            hint = ("with every score far below 0 your output is inf/NaN: start the running max at "
                    "-inf (np.full(Nq, -np.inf)), not 0 or another number; from 0, exp(s - m) "
                    "underflows to 0 for every key and l = 0")
        _expect(impl, *(t.astype(dtype) for t in (q, k, v)), 1.0, "scores about -1000",
                hint or "m starts at -inf and is the max of the scores seen", check_lse=True)


def check_one_pass(impl, rng):
    """one pass over the keys: each key read once, in order, never all 1000+ at once"""
    for dtype in DTYPES:
        Nq, Nk, D = 5, int(rng.integers(1000, 1100)), 16
        q, k, v = _random(rng, dtype, Nq, Nk, D)
        k[-1] = q.sum(axis=0) * dtype(40)          # the last key scores highest, far above
        recs = {name: checks.ReadRecorder(t.copy(), axis=0) for name, t in (("k", k), ("v", v))}
        checks.function(impl, "online_attention")(q.copy(), recs["k"], recs["v"], scale=0.2)
        for name, rec in recs.items():
            why = checks.stream_problem(rec.reads, Nk, Nk // 2, what="keys")
            if why is not None:
                checks.fail(f"with {Nk} keys your online_attention is not one pass over {name}: "
                            f"{why}",
                            "walk over the keys once, k[j] and v[j] (or blocks k[j:j + b]) in "
                            "order, folding each into m, l and acc before the next; the whole "
                            "score matrix q @ k.T, or a first loop for the max and a second for "
                            "the sums, is the two-pass attention this exercise replaces")
        _expect(impl, q, k, v, 0.2, "the last key scores highest", "rescale when the max grows",
                check_lse=True)


@checks.not_under_grade
def check_memory(impl, rng):
    """memory stays O(Nq D) as the keys grow (no buffer of the scores or keys already read)"""
    fn = checks.function(impl, "online_attention")
    Nq, D = 16, 8
    q, k, v = (rng.standard_normal(s) for s in ((Nq, D), (1500, D), (1500, D)))
    why = checks.memory_problem(lambda *t: fn(*t, scale=0.3),
                                lambda n: (q.copy(), k[:n].copy(), v[:n].copy()),
                                (300, 1500), Nq * q.itemsize, what="keys")
    if why is not None:
        checks.fail(f"for {Nq} float64 queries of head dim {D}: {why}",
                    "keep only m, l and acc between keys: fold each key's score into them and "
                    "drop it. Keeping the scores (or keys) to finish after the loop is O(N) "
                    "memory, the two-pass attention this exercise replaces")


CHECKS = [check_random, check_lse, check_default_scale, check_equal_scores, check_growing_scores,
          check_scores_far_apart, check_scores_far_below_zero, check_one_pass, check_memory]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex03(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
