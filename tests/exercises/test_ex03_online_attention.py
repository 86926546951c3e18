"""Grader of exercise 03 (lesson 03): online_attention, merge_states and split_attention.

online_attention(q, k, v, *, scale=None) -> (out, lse): out and lse are compared with
attention_ref (float64) under flashlib.testing's rule, baseline the textbook attention in the
same dtype (or flashlib.teach.tiled.online_attention when that rounds more), for Nq != Nk, head
dim 80, float32 and float64, and for keys built so that the scores are all equal, grow from key
to key, lie further apart than exp's range, or all lie far below 0 (about -1000, and about -1e6
in float64: a running max started at a finite floor instead of -inf fails there). Small probes name the mistake: scale left out,
output normalised too early, accumulator not rescaled, running max not kept, lse without the max.

merge_states(out_a, lse_a, out_b, lse_b) -> (out, lse) is compared with the merge computed in
float64 from the same inputs (baseline: flashlib.teach.tiled.merge_states in the inputs' dtype,
weights relative to the larger lse). The docstring also allows the log-space form (the merged lse
first, each part's weight e^(lse_part - lse)), whose weights carry the rounding of its lse (ulps
of |lse|, 0.00024 at 3000 in float32): an out off by that much is accepted when the lse is right
and out follows it, i.e. matches the weights e^(lse_part - lse) of the returned lse (computed in
float64; baseline: the same in the inputs' dtype), which a merge that scales lse before
subtracting does not), on partial results
of real attention, on rows where one part or both are empty (lse = -inf), and on lse values in
the thousands (both signs) and, in float64, near -1e6 (an empty part recognised by a finite
threshold instead of -inf fails there), and on a batch with no rows (leading dims (0,) and
(2, 0)). split_attention(q, k, v, cuts) is compared with
attention_ref on cuts with empty and one-key parts, and no key at all; in this process (not
under ``flashlib grade``, where reads cannot be seen) k and v are recorders: no read may span
two parts. Probes name the mistake: a plain average, exp(lse) overflowing, NaN on empty parts,
the max taken for the lse.
"""
import math

import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.reference import attention_ref
from flashlib.testing import attention_magnitudes, max_error, tolerance
from flashlib.teach.tiled import merge_states as library_merge
from flashlib.teach.tiled import online_attention as library_attention

pytestmark = pytest.mark.ex03
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is
# reached (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.teach.tiled.online_attention", "flashlib.teach.tiled.merge_states",
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
    """online_attention: out matches attention_ref on random inputs (float32 and float64, Nq != Nk,
    D = 80)"""
    for dtype in DTYPES:
        for Nq, Nk in ((17, 130), (1, 97), (97, 1)):
            scale = float(rng.uniform(0.1, 0.4))
            _expect(impl, *_random(rng, dtype, Nq, Nk), scale, f"scale={scale:.3f}",
                    "follow the recurrence in the docstring")


def check_lse(impl, rng):
    """online_attention: lse is the log-sum-exp of each row of scale * q @ k.T"""
    for dtype in DTYPES:
        scale = float(rng.uniform(0.1, 0.4))
        _expect(impl, *_random(rng, dtype, 17, 97), scale, f"scale={scale:.3f}",
                "lse = m + log(l) after the last key", check_lse=True)


def check_default_scale(impl, rng):
    """online_attention: scale=None means 1/sqrt(D)"""
    for dtype in DTYPES:
        _expect(impl, *_random(rng, dtype, 9, 33), None, "scale=None",
                "when scale is None use 1/sqrt(D), D = q.shape[1]", check_lse=True)


def _structured(rng, kind, dtype, scale):
    q, k, v = _probe_inputs(kind, dtype, Nq=17, Nk=97, D=80, scale=scale)
    noise = rng.uniform(0.9, 1.1)                          # fresh inputs every run
    return q * dtype(noise), k, v + dtype(rng.standard_normal())


def check_equal_scores(impl, rng):
    """online_attention: identical keys give the mean of v (normalise once, at the end)"""
    for dtype in DTYPES:
        _expect(impl, *_structured(rng, "equal", dtype, 0.2), 0.2, "all scores equal",
                "with equal scores, out is the mean of v")


def check_growing_scores(impl, rng):
    """online_attention: scores that grow from key to key: l and acc are rescaled"""
    for dtype in DTYPES:
        _expect(impl, *_structured(rng, "growing", dtype, 0.5), 0.5, "scores growing",
                "rescale l and acc by exp(m_old - m_new) when the max grows", check_lse=True)


def check_scores_far_apart(impl, rng):
    """online_attention: scores further apart than exp's range
    (past 88.72 in float32) stay finite"""
    for dtype in DTYPES:
        q, k, v = _structured(rng, "apart", dtype, 1.0)
        for order in (slice(None), slice(None, None, -1)):   # max first, then max last
            # copies: attention_ref cannot take NumPy views with negative strides
            _expect(impl, q, k[order].copy(), v[order].copy(), 1.0,
                    "scores spread beyond exp's range",
                    "subtract the running max: every exponent must be <= 0", check_lse=True)


def check_scores_far_below_zero(impl, rng):
    """online_attention: every score far below 0 (about -1000, and about -1e6 in float64): the
    running max starts at -inf, not 0 or another floor"""
    for dtype, depth in ((np.float32, 30.0), (np.float64, 30.0), (np.float64, 3e4)):
        Nq, Nk, D = 9, 33, 32
        q = 1 + 0.1 * rng.standard_normal((Nq, D))
        k = -depth + 0.5 * rng.standard_normal((Nk, D))
        v = rng.standard_normal((Nk, D))
        out, _ = _call(impl, *(t.astype(dtype) for t in (q, k, v)), scale=1.0)
        hint = None
        if not np.all(np.isfinite(out)):
            hint = ("with every score far below 0 your output is inf/NaN: start the running max at "
                    "-inf (np.full(Nq, -np.inf)), not 0 or another number; from 0, exp(s - m) "
                    "underflows to 0 for every key and l = 0")
        _expect(impl, *(t.astype(dtype) for t in (q, k, v)), 1.0,
                f"scores about {-depth * D:.0f}",
                hint or "m starts at -inf and is the max of the scores seen", check_lse=True)


def check_one_pass(impl, rng):
    """online_attention: one pass over the keys: each key read once, in order, never all 1000+ at
    once"""
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
    """online_attention: memory stays O(Nq D) as the keys grow (no buffer of the scores or keys
    already read)"""
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


# ---- merge_states -------------------------------------------------------------------------

HINT_OVERFLOW = ("your merge overflows when the lse are large: e^lse is inf past 88.72 in "
                 "float32 (709.78 in float64), and lse can be in the thousands (inf / inf is NaN). "
                 "Subtract the larger of the two lse before every exp: each part's weight is "
                 "e^(lse_part - m) / (e^(lse_a - m) + e^(lse_b - m)), every exponent <= 0")
HINT_LARGE = ("with lse in the thousands, your merge loses digits: in float32 one ulp of 3000 "
              "is 0.00024, so e^(lse_a * c) / e^(m * c) or exp2(lse_a * log2e - m * log2e) are "
              "off by several times that relative. Subtract first (lse_a - m is exact when they "
              "are close), then scale and exponentiate the difference (or merge in log space: "
              "lse = logaddexp(lse_a, lse_b), weights e^(lse_a - lse))")
HINT_EMPTY = ("a part with no key (lse = -inf, out = 0) must leave the other unchanged, and a row "
              "empty in both parts must give out = 0 and lse = -inf: exp(-inf - (-inf)) is NaN, "
              "and so is 0 / 0. Where both lse are -inf, take 0 as the reference, and divide by "
              "1 where the weights sum to 0")


def _given_lse(out_a, lse_a, out_b, lse_b, lse, dtype):
    """The merged out that the merged ``lse`` implies, e^(lse_a - lse) out_a + e^(lse_b - lse)
    out_b, computed in ``dtype`` (rows with lse = -inf: 0)."""
    a, b, la, lb, ls = (np.asarray(x, dtype) for x in (out_a, out_b, lse_a, lse_b, lse))
    ref = np.where(np.isneginf(ls), 0, ls).astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.exp(la - ref)[..., None] * a + np.exp(lb - ref)[..., None] * b


def _follows_its_lse(inputs, out, lse, lse_ref, lse_b, dtype, magnitude):
    """Whether (out, lse) is a log-space merge: lse within the rule's tolerance of the reference,
    and out within it of the out its own lse implies."""
    if not np.all(np.isfinite(lse) | np.isneginf(lse_ref)) or \
            max_error(lse, lse_ref) > tolerance(lse_ref, lse_b, dtype):
        return False
    implied = _given_lse(*inputs, lse, np.float64)
    return max_error(out, implied) <= tolerance(implied, _given_lse(*inputs, lse, dtype), dtype,
                                                magnitude=magnitude)


def _merge64(out_a, lse_a, out_b, lse_b):
    """The merge in float64, from the inputs as given."""
    return library_merge(*(np.asarray(t, np.float64) for t in (out_a, lse_a, out_b, lse_b)))


def _call_merge(impl, out_a, lse_a, out_b, lse_b):
    args = [t.copy() for t in (out_a, lse_a, out_b, lse_b)]
    result = checks.function(impl, "merge_states")(*args)
    for name, before, after in zip(("out_a", "lse_a", "out_b", "lse_b"),
                                   (out_a, lse_a, out_b, lse_b), args):
        if not np.array_equal(before, after):
            checks.fail(f"merge_states changed its argument {name} in place: return new arrays; "
                        "the caller may still need it")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        checks.fail(f"merge_states returned {type(result).__name__}; it should return the pair "
                    "(out, lse)")
    out, lse = (checks.as_array(t, name) for t, name in zip(result, ("out", "lse")))
    for name, got, want in (("out", out, out_a), ("lse", lse, lse_a)):
        if got.shape != want.shape:
            checks.fail(f"merge_states' {name} has shape {got.shape}; expected {want.shape}, the "
                        f"shape of {name}_a")
        if got.dtype != want.dtype:
            checks.fail(f"merge_states' {name} is {got.dtype} for {want.dtype} inputs: the "
                        "docstring promises the inputs' dtype")
    return out, lse


def _merge_diagnose(impl):
    """Float64 probes with one value per row (D = 1): the first hint that fits, or None."""
    def merge(lse_a, lse_b, out_a=1.0, out_b=0.0):
        return _call_merge(impl, np.array([[out_a]]), np.array([lse_a]), np.array([[out_b]]),
                           np.array([lse_b]))

    out, lse = merge(0.0, np.log(3.0))              # part b holds 3/4 of the mass: out = 1/4
    if np.isclose(out[0, 0], 0.5):
        return ("your out is the plain average of the parts: each part counts by its share of "
                "the softmax's mass, e^(lse_part - lse), with lse the log-sum-exp over both")
    if np.isclose(out[0, 0], 0.75):
        return ("your weights are swapped: out_a's weight is e^(lse_a - lse), out_b's "
                "e^(lse_b - lse)")
    if np.isclose(lse[0], np.log(3.0)):
        return ("your lse is the larger of the two: over both parts it is log(e^lse_a + e^lse_b), "
                "a log-sum-exp of the two")
    if np.isclose(out[0, 0], 1 / 3):
        return ("your weights do not sum to 1: divide by their sum (or weight by e^(lse_part - "
                "lse) with lse the merged log-sum-exp)")
    if not (np.isclose(out[0, 0], 0.25) and np.isclose(lse[0], np.log(4.0))):
        return ("lse = log(e^lse_a + e^lse_b) over both parts, and out = e^(lse_a - lse) out_a + "
                "e^(lse_b - lse) out_b")
    out, lse = merge(3000.0, 3000.0 + np.log(3.0))
    if not (np.isclose(out[0, 0], 0.25) and np.isclose(lse[0], 3000.0 + np.log(4.0))):
        return HINT_OVERFLOW
    out, lse = merge(-np.inf, 2.0, 0.0, 5.0)
    if np.isnan(out).any() or np.isnan(lse).any() or not (out[0, 0] == 5.0 and lse[0] == 2.0):
        return HINT_EMPTY
    out, lse = merge(-np.inf, -np.inf, 0.0, 0.0)
    if np.isnan(out).any() or np.isnan(lse).any() or out[0, 0] != 0 or lse[0] != -np.inf:
        return HINT_EMPTY
    return None


def _parts(rng, dtype, lead=(2, 3), Nq=17, D=80, offset=0.0):
    """Two partial results of real attention over disjoint keys (float64, then cast); lse moved by
    ``offset`` and the query rows scaled so that some rows' mass sits in one part."""
    four = (1,) * (2 - len(lead)) + lead                    # attention_ref's (B, H, ...)
    q = rng.standard_normal(four + (Nq, D)) * rng.uniform(0.5, 3, (Nq, 1))
    k, v = rng.standard_normal(four + (40, D)), rng.standard_normal(four + (40, D))
    cut = int(rng.integers(1, 39))
    (out_a, lse_a), (out_b, lse_b) = (attention_ref(q, k[..., s, :], v[..., s, :])
                                      for s in (slice(None, cut), slice(cut, None)))
    return tuple(np.asarray(t, np.float64).reshape(lead + t.shape[2:]).astype(dtype)
                 for t in (out_a, lse_a + offset, out_b, lse_b + offset))


def _expect_merge(impl, inputs, what, default_hint):
    out, lse = _call_merge(impl, *inputs)
    hint = lambda: _quietly(_merge_diagnose, impl) or default_hint  # noqa: E731
    if np.isnan(out).any() or np.isnan(lse).any():
        checks.fail(f"merge_states gives NaN for {what}", hint())
    both = np.isneginf(inputs[1]) & np.isneginf(inputs[3])            # rows empty in both
    if np.any(out[both] != 0) or np.any(lse[both] != -np.inf):
        checks.fail(f"merge_states gives out != 0 or lse != -inf for a row empty in both parts "
                    f"({what})", HINT_EMPTY)
    dtype = inputs[0].dtype
    out_ref, lse_ref = _merge64(*inputs)
    out_b, lse_b = library_merge(*inputs)
    what = f"{dtype} partial results {inputs[0].shape}, {what}"
    magnitude = max(np.abs(inputs[0]).max(), np.abs(inputs[2]).max())
    if not _follows_its_lse(inputs, out, lse, lse_ref, lse_b, dtype, magnitude):
        checks.expect_close(out, out_ref, baseline=out_b, dtype=dtype, name=f"out for {what}",
                            hint=hint, magnitude=magnitude)
    checks.expect_close(lse, lse_ref, baseline=lse_b, dtype=dtype, name=f"lse for {what}",
                        hint=hint)


def _quietly(diagnose, *args):
    """A probe's hint, or None when the probe itself fails (a function missing or not done)."""
    try:
        return diagnose(*args)
    except Exception:
        return None


def check_merge_random(impl, rng):
    """merge_states: two parts of real attention merge into the attention over both"""
    for dtype in DTYPES:
        _expect_merge(impl, _parts(rng, dtype), "over random keys",
                      "out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b, lse over both parts")


def check_merge_empty_parts(impl, rng):
    """merge_states: an empty part (lse = -inf) changes nothing; both empty give 0 and -inf"""
    for dtype in DTYPES:
        out_a, lse_a, out_b, lse_b = _parts(rng, dtype, lead=(), Nq=12)
        out_a[:4], lse_a[:4] = 0, -np.inf                  # rows 0-3: part a empty
        out_b[4:8], lse_b[4:8] = 0, -np.inf                # rows 4-7: part b empty
        out_a[8:], lse_a[8:], out_b[8:], lse_b[8:] = 0, -np.inf, 0, -np.inf  # 8-11: both
        _expect_merge(impl, (out_a, lse_a, out_b, lse_b),
                      "rows 0-3 with part a empty, 4-7 part b, 8-11 both", HINT_EMPTY)


def check_merge_no_rows(impl, rng):
    """merge_states: a batch with no rows (leading dims (0,) and (2, 0)) gives empty results of
    the right shapes and dtype"""
    for dtype, lead in ((np.float32, (0,)), (np.float64, (2, 0))):
        out_a, out_b = np.zeros(lead + (80,), dtype), np.zeros(lead + (80,), dtype)
        lse_a, lse_b = np.zeros(lead, dtype), np.zeros(lead, dtype)
        try:
            _call_merge(impl, out_a, lse_a, out_b, lse_b)
        except (checks.CheckFailed, NotImplementedError):    # a verdict, or not done yet
            raise
        except Exception as e:
            checks.fail(f"merge_states raised {type(e).__name__} ({e}) for {dtype.__name__} partial "
                        f"results of shape {out_a.shape}, a batch with no rows",
                        "a batch may hold no rows: merge with whole-array operations over the "
                        "leading dims (np.maximum, np.exp, np.where), which give empty results for "
                        "empty inputs, rather than a loop over the rows whose results are stacked "
                        "(np.stack of nothing raises)")


def check_merge_large_lse(impl, rng):
    """merge_states: lse in the thousands (both signs), past exp's range, and near -1e6 in float64,
    stay finite and right"""
    for dtype in DTYPES:
        for offset in (3000.0, -3000.0):
            inputs = _parts(rng, dtype, lead=(), Nq=9, offset=offset)
            _expect_merge(impl, inputs, f"lse near {offset:.0f}", HINT_LARGE)
        out_a, lse_a, out_b, lse_b = _parts(rng, dtype, lead=(), Nq=9)
        lse_a, lse_b = lse_a + dtype(1000), lse_b - dtype(1000)     # part a holds all the mass
        _expect_merge(impl, (out_a, lse_a, out_b, lse_b), "lse_a near 1000, lse_b near -1000",
                      HINT_OVERFLOW)
    # far below any floor a merge might take for "empty": only -inf is empty
    inputs = _parts(rng, np.float64, lead=(), Nq=9, offset=-1e6)
    _expect_merge(impl, inputs, "lse near -1e6",
                  "only lse = -inf marks an empty part: a part with lse near -1e6 holds keys (all "
                  "its scores are far below 0) and counts by its share, e^(lse_part - m) with m "
                  "the larger lse; test for -inf (np.isneginf), not lse < some threshold")


# ---- split_attention ----------------------------------------------------------------------

def _cuts(rng, Nk):
    """0 = cuts[0] <= ... <= cuts[-1] = Nk, with an empty part and (for Nk >= 2) a one-key part."""
    inner = sorted(rng.choice(np.arange(1, Nk), size=min(4, Nk - 1), replace=False).tolist()) \
        if Nk > 1 else []
    one = [inner[0], inner[0] + 1] if inner and inner[0] + 1 < Nk else []
    return sorted([0, 0, *inner, *one, Nk])


def _split_diagnose(impl, q, k, v, cuts):
    """Which of the learner's functions the failure comes from."""
    fn = checks.function(impl, "split_attention")
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    out, _ = fn(q.copy(), k.copy(), v.copy(), list(cuts), scale=0.3)
    if np.isnan(out).any():
        return ("NaN from an empty part: online_attention needs at least one key (with none, "
                "acc / l is 0 / 0); skip the empty parts (or give them out = 0, lse = -inf)")
    if _quietly(_merge_diagnose, impl) is not None:
        return "your merge_states is wrong: see its checks above"
    if _quietly(_diagnose, impl) is not None:
        return "your online_attention is wrong: see its checks above"
    return ("part i is the keys cuts[i]:cuts[i + 1]: every key in exactly one part, each part "
            "attended with online_attention and merged into the result with merge_states")


def _expect_split(impl, q, k, v, cuts, scale):
    out, lse = checks.function(impl, "split_attention")(q.copy(), k.copy(), v.copy(), list(cuts),
                                                         scale=scale)
    out, lse = (checks.as_array(t, name) for t, name in zip((out, lse), ("out", "lse")))
    what = f"split_attention, {q.dtype} q {q.shape}, k and v {k.shape}, cuts {list(cuts)}"
    for name, got, want in (("out", out, q.shape), ("lse", lse, q.shape[:1])):
        if got.shape != want or got.dtype != q.dtype:
            checks.fail(f"{what}: {name} is {got.dtype} {got.shape}; expected {q.dtype} {want}")
    hint = lambda: (_quietly(_split_diagnose, impl, q, k, v, cuts)  # noqa: E731
                    or "merge every part's result into the running one")
    if np.isnan(out).any() or np.isnan(lse).any():
        checks.fail(f"{what} has NaN", hint())
    if k.shape[0] == 0:
        if np.any(out != 0) or np.any(lse != -np.inf):
            checks.fail(f"{what}: with no key at all, out must be 0 and lse -inf",
                        "start from the empty result (out = 0, lse = -inf) and merge the parts "
                        "into it: with no part, it stays empty")
        return
    out_ref, lse_ref = _reference(q, k, v, scale)
    out_t, lse_t = _textbook(q, k, v, scale)
    mags = attention_magnitudes(q[None, None], k[None, None], v[None, None], scale=scale)
    checks.expect_close(out, out_ref, baseline=out_t, dtype=q.dtype, name=f"out of {what}",
                        hint=hint, magnitude=mags["out"])
    checks.expect_close(lse, lse_ref, baseline=lse_t, dtype=q.dtype, name=f"lse of {what}",
                        hint=hint, magnitude=mags["lse"])


def check_split_random(impl, rng):
    """split_attention: cuts with empty and one-key parts match attention over all keys"""
    for dtype in DTYPES:
        for Nk in (130, 2):
            q, k, v = _random(rng, dtype, 17, Nk)
            _expect_split(impl, q, k, v, _cuts(rng, Nk), float(rng.uniform(0.1, 0.4)))


def check_split_no_key(impl, rng):
    """split_attention: no key at all (Nk = 0) gives out = 0 and lse = -inf; one part only"""
    for dtype in DTYPES:
        q, k, v = _random(rng, dtype, 5, 0)
        _expect_split(impl, q, k, v, [0, 0], 0.2)
        q, k, v = _random(rng, dtype, 5, 33)
        _expect_split(impl, q, k, v, [0, 0, 33, 33], 0.2)


@checks.not_under_grade
def check_split_reads_parts(impl, rng):
    """split_attention reads each part's keys on its own (no read spans two parts)"""
    q, k, v = _random(rng, np.float64, 9, 97, D=16)
    cuts = _cuts(rng, 97)
    part = np.searchsorted(cuts, np.arange(97), side="right")    # (Nk,) the part of each key
    recs = {name: checks.ReadRecorder(t.copy(), axis=0) for name, t in (("k", k), ("v", v))}
    checks.function(impl, "split_attention")(q.copy(), recs["k"], recs["v"], list(cuts),
                                             scale=0.3)
    for name, rec in recs.items():
        for r in rec.reads:
            if r.size and part[r.min()] != part[r.max()]:
                checks.fail(f"with cuts {cuts}, your split_attention reads {name}[{r.min()}], in "
                            f"part {part[r.min()] - 1}, and {name}[{r.max()}], in part "
                            f"{part[r.max()] - 1}, at once",
                            "attend to each part on its own, online_attention(q, k[a:b], v[a:b]) "
                            "for part a:b, then merge the parts' results with merge_states: the "
                            "parts stand for splits of a KV cache held by different programs")
    _expect_split(impl, q, k, v, cuts, 0.3)


CHECKS = [check_random, check_lse, check_default_scale, check_equal_scores, check_growing_scores,
          check_scores_far_apart, check_scores_far_below_zero, check_one_pass, check_memory,
          check_merge_random, check_merge_empty_parts, check_merge_large_lse, check_merge_no_rows,
          check_split_random,
          check_split_no_key, check_split_reads_parts]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex03(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
