"""Grader of exercise 02 (lesson 02): a long row's softmax streamed in blocks.

online_normalizer(x, block_size) -> (m, d) must equal the row max and sum(exp(x - m)) in float64
under flashlib.testing's rule (baseline: the three-pass computation in the same dtype, or
flashlib's own online version when that rounds more), for block sizes that divide N, that do
not, and that exceed it, on rows whose max grows block after block, comes first, or sits past
exp's overflow point, and on masked rows (-inf: whole rows, leading blocks). Tiny probes ([0, 1]
and [1, 0] one element at a time, a row of 23 in blocks of 5) name the mistake.

three_pass_softmax(x, block_size) and online_softmax(x, block_size) -> y are compared with a
float64 softmax (rows of -inf only: 0) on the same kinds of rows, and, in this process, x is
handed over as a recorder of the columns each read takes: three sweeps, then two, never more
than block_size columns at a time (not under ``flashlib grade``, where the learner's code runs
in another process and its reads cannot be seen; the values are checked there too).
"""
import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.teach.softmax import online_normalizer as library_normalizer

pytestmark = pytest.mark.ex02
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is
# reached (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.teach.softmax.online_normalizer",
                    "flashlib.teach.softmax.merge_states", "flashlib.teach.softmax.online_softmax",
                    "flashlib.teach.softmax.safe_softmax")

DTYPES = (np.float32, np.float64)
NEG = -np.inf
# probe rows, in blocks of 2: all -inf; two leading blocks of -inf; -inf scattered
MASKED_PROBE = np.array([[NEG] * 7, [NEG, NEG, NEG, NEG, 0.5, NEG, 2.0],
                         [1.0, NEG, -1.0, 0.0, NEG, 3.0, NEG]])

HINT_EMPTY_ROW = ("a row of -inf only (every score masked) gives NaN: its max is -inf, and "
                  "exp(-inf - (-inf)) is NaN (then 0 / 0). Where the max is still -inf, take 0 as "
                  "the reference (exp(-inf - 0) = 0), and divide by 1 where d is 0: such a row "
                  "gets m = -inf, d = 0 and a softmax of all 0")
HINT_LEADING = ("a row whose first blocks are all -inf gives NaN: while only -inf has been seen "
                "the running max is -inf, and exp(m_old - m_new), exp(x - m_new) are "
                "exp(-inf - (-inf)) = NaN. Use 0 as the reference max while it is -inf "
                "(exp(-inf - 0) = 0), in every block, not only at the end")
HINT_MAX = ("your softmax overflows for large scores: exp(x) is inf past 88.72 in float32 (709.78 "
            "in float64); every exponent must be x - m <= 0, with m the max of the row")


def _three_pass(x):
    """(m, d) in x's dtype, a row of -inf only giving (-inf, 0)."""
    m = x.max(axis=-1, keepdims=True)
    return m, np.exp(x - np.where(np.isneginf(m), 0, m)).sum(axis=-1, keepdims=True)


def _reference(x):
    return _three_pass(x.astype(np.float64))


def _call(impl, x, block_size):
    arg = x.copy()
    result = checks.function(impl, "online_normalizer")(arg, block_size)
    if not np.array_equal(arg, x):
        checks.fail(f"online_normalizer changed its argument x ({x.dtype}) in place: compute "
                    "into new arrays; the caller may still need x")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        checks.fail(f"online_normalizer returned {type(result).__name__}; it should return "
                    "the pair (m, d)")
    m, d = (checks.as_array(t, name) for t, name in zip(result, ("m", "d")))
    want = x.shape[:-1] + (1,)
    for name, t in (("m", m), ("d", d)):
        if t.shape != want:
            checks.fail(f"{name} has shape {t.shape} for x of shape {x.shape}; expected {want}: "
                        "keep the reduced axis (keepdims=True), as the stub's m and d do")
        if t.dtype != x.dtype:
            checks.fail(f"{name} is {t.dtype} for {x.dtype} x: the docstring promises x's dtype "
                        "(start from the stub's m and d, and add no float64 constants or "
                        "astype)")
    return m, d


def _matches(m, d, x):
    m_ref, d_ref = _reference(x)
    return np.allclose(m, m_ref, rtol=1e-9) and np.allclose(d, d_ref, rtol=1e-9)


def _diagnose(impl):
    """Run tiny float64 probes; return the first hint that fits, or None."""
    x = np.random.default_rng(2).standard_normal((1, 23))
    m, d = _call(impl, x, 5)
    for k in range(1, 23):
        if _matches(m, d, x[:, :k]):
            return (f"your loop stops before the end of the row: with N = 23 and block_size = 5 "
                    f"it used only the first {k} columns. Loop over range(0, N, block_size); "
                    "x[..., start:start + block_size] gives the shorter last block by itself")
    e = np.e
    m, d = _call(impl, np.array([[0.0, 1.0]]), 1)
    if np.isnan(d).any() or np.isclose(d[0, 0], 1 + e):
        return ("your rescale factor is inverted: it must be exp(m_old - m_new), which is <= 1 "
                "(and 0 for the first block, where m_old = -inf); exp(m_new - m_old) is inf "
                "there, and 0 * inf is NaN")
    if m[0, 0] == 1.0 and np.isclose(d[0, 0], 2.0):
        return ("your d is too large when the max grows: did you rescale it by "
                "exp(m_old - m_new) before adding the new block's terms?")
    m, d = _call(impl, np.array([[1.0, 0.0]]), 1)
    if m[0, 0] != 1.0:
        return ("your m is not the max of the whole row: keep the running max, "
                "m_new = max(m_old, block max), not the max of the last block")
    x = 1000 + np.random.default_rng(3).uniform(0, 5, (1, 7))
    m, d = _call(impl, x, 3)
    if not np.all(np.isfinite(d)):
        return ("d overflows for large x: add exp(x - m_new), relative to the running max, "
                "never exp(x) itself")
    m, d = _call(impl, MASKED_PROBE, 2)
    if np.isnan(d[0]).any() or np.isnan(m[0]).any():
        return HINT_EMPTY_ROW
    if np.isnan(d[1]).any():
        return HINT_LEADING
    return None


def _expect(impl, x, block_size, default_hint):
    m, d = _call(impl, x, block_size)
    m_ref, d_ref = _reference(x)
    m_b, d_b = _three_pass(x)
    with np.errstate(invalid="ignore"):
        d_lib = library_normalizer(x, block_size)[1]      # NaN on masked blocks: not a baseline
    baseline = (d_b,) if np.isnan(d_lib).any() else (d_b, d_lib)
    what = f"{x.dtype} x of shape {x.shape}, block_size={block_size}"
    hint = lambda: _diagnose(impl) or default_hint  # noqa: E731
    if np.isnan(m).any() or np.isnan(d).any():
        checks.fail(f"for {what} your (m, d) has NaN", hint())
    checks.expect_close(m, m_ref, baseline=m_b, dtype=x.dtype, name=f"m for {what}", hint=hint)
    checks.expect_close(d, d_ref, baseline=baseline, dtype=x.dtype, name=f"d for {what}",
                        hint=hint)


class _Row(checks.ReadRecorder):
    """x in HBM: ReadRecorder over the columns; np.empty_like and its kind read only the shape."""

    SHAPE_ONLY = (np.empty_like, np.zeros_like, np.ones_like, np.full_like)

    def __array_function__(self, func, types, args, kwargs):
        if func in self.SHAPE_ONLY:
            bare = lambda t: t._a if isinstance(t, checks.ReadRecorder) else t  # noqa: E731
            return func(*map(bare, args), **{k: bare(v) for k, v in kwargs.items()})
        return super().__array_function__(func, types, args, kwargs)


def _sweeps(reads, n):
    """How many times over ``reads`` (ReadRecorder.reads) read the n columns: the columns read,
    over n, a read of the block just read (or part of it, still held) not counted again; and
    the largest single read."""
    total, held, largest = 0, np.array([], dtype=int), 0
    for r in reads:
        largest = max(largest, r.size)
        if np.isin(r, held).all():
            continue
        total, held = total + r.size, r
    return total / n, largest


def check_random_rows(impl, rng):
    """online_normalizer: random rows, block sizes that divide N (float32 and float64)"""
    for dtype in DTYPES:
        for shape, sizes in (((9, 96), (1, 4, 32)), ((2, 3, 17), (1, 17))):
            x = (3 * rng.standard_normal(shape)).astype(dtype)
            for block_size in sizes:
                _expect(impl, x, block_size, "follow the update in the docstring")


def check_growing_max(impl, rng):
    """online_normalizer: the max grows from block to block
    (rows sorted ascending): d is rescaled"""
    for dtype in DTYPES:
        x = np.sort(3 * rng.standard_normal((9, 65)), axis=-1).astype(dtype)
        for block_size in (1, 8):
            _expect(impl, x, block_size, "when the max grows, d' <- d' * exp(m_old - m_new) + "
                    "sum(exp(block - m_new))")


def check_max_first(impl, rng):
    """online_normalizer: the max comes first, smaller values after: m is the running max"""
    for dtype in DTYPES:
        x = -np.sort(3 * rng.standard_normal((9, 65)), axis=-1).astype(dtype)
        for block_size in (1, 8):
            _expect(impl, x, block_size, "m_new = max(m_old, block max): m never decreases")


def check_shorter_last_block(impl, rng):
    """online_normalizer: block sizes that do not divide N, N = 1, and block_size > N"""
    for dtype in DTYPES:
        for shape, sizes in (((9, 97), (5, 16)), ((4, 1), (1, 3)), ((9, 17), (200,))):
            x = (3 * rng.standard_normal(shape)).astype(dtype)
            for block_size in sizes:
                _expect(impl, x, block_size, "the last block may be shorter than block_size")


def check_large_values(impl, rng):
    """online_normalizer: large inputs (past exp's overflow point) stay finite"""
    for dtype, offset in ((np.float32, 100.0), (np.float64, 1000.0)):
        x = (offset + rng.uniform(0, 20, (9, 40))).astype(dtype)
        _expect(impl, x, 7, "every exponent must be <= 0: subtract the running max")


def check_one_pass(impl, rng):
    """online_normalizer: one pass over each row, block_size columns at a time (rows of 1000+, max
    in the last block)"""
    for dtype in DTYPES:
        # never a power of two: a loop that rounds the block up to one reads more than asked
        n, block_size = int(rng.integers(1000, 1100)), int(rng.choice([7, 48, 100]))
        x = (3 * rng.standard_normal((4, n))).astype(dtype)
        x[:, -1] = x.max(axis=-1) + 150           # the max comes last, past exp's range (float32)
        x[1] -= 3e4                                # a row far below 0
        x = x.astype(dtype)
        rec = checks.ReadRecorder(x.copy(), axis=-1)
        result = checks.function(impl, "online_normalizer")(rec, block_size)
        times, largest = _sweeps(rec.reads, n)
        if largest > block_size or times > 1:
            why = (f"a step reads {largest} columns at once" if largest > block_size else
                   f"it reads x {times:.2f} times over")
            checks.fail(f"for a row of {n} and block_size={block_size}, your online_normalizer "
                        f"is not one pass in blocks: {why}",
                        "read x one block at a time, x[..., start:start + block_size], and fold "
                        "each block into the running (m, d) before the next; a max over the "
                        "whole row (x.max, np.max(x), x.T ...) or a second loop is the two-pass "
                        "softmax this exercise replaces")
        del result
        _expect(impl, x, block_size, "the max is in the last block: rescale d when it comes")


@checks.not_under_grade
def check_memory(impl, rng):
    """online_normalizer: memory stays O(block_size) as the rows grow (no buffer of the blocks
    already read)"""
    fn = checks.function(impl, "online_normalizer")
    rows, block_size = 4, int(rng.choice([7, 10, 13]))
    x = 3 * rng.standard_normal((rows, 5000))
    why = checks.memory_problem(lambda t: fn(t, block_size), lambda n: (x[:, :n].copy(),),
                                (1000, 5000), rows * x.itemsize)
    if why is not None:
        checks.fail(f"for {rows} float64 rows in blocks of {block_size}: {why}",
                    "keep only the running (m, d) between blocks: each block is folded in and "
                    "dropped. Keeping the blocks (or their exps) to finish after the loop is "
                    "O(N) memory, the two-pass softmax this exercise replaces")


def _masked_rows(rng, dtype, rows=9, n=97):
    """Random rows with -inf: row 0 all of it; rows 1-3 -inf in their first 40 columns (a few
    leading blocks); rows 4-6 -inf scattered; rows 7+ none."""
    x = 3 * rng.standard_normal((rows, n))
    x[0] = -np.inf
    x[1:4, :40] = -np.inf
    x[4:7][rng.random((3, n)) < 0.5] = -np.inf
    return x.astype(dtype)


def check_normalizer_masked(impl, rng):
    """online_normalizer: masked rows (-inf): a row of -inf only gives (-inf, 0), leading -inf
    blocks no NaN"""
    for dtype in DTYPES:
        x = _masked_rows(rng, dtype)
        for block_size in (8, 13):
            _expect(impl, x, block_size, HINT_LEADING)


# ---- three_pass_softmax and online_softmax: y, and how x is read ---------------------------

SOFTMAXES = ("three_pass_softmax", "online_softmax")


def _softmax(x):
    """The softmax in x's dtype, three passes over the whole row; a row of -inf only -> 0."""
    m, d = _three_pass(x)
    return np.exp(x - np.where(np.isneginf(m), 0, m)) / np.where(d > 0, d, 1)


def _log_space(x):
    """exp(x - lse) in x's dtype, lse by np.logaddexp.reduce: a second baseline (ex01's)."""
    lse = np.logaddexp.reduce(x, axis=-1, keepdims=True)
    return np.exp(x - np.where(np.isneginf(lse), 0, lse))


def _call_softmax(impl, name, x, block_size):
    arg = x.copy()
    y = checks.function(impl, name)(arg, block_size)
    if not np.array_equal(arg, x, equal_nan=True):
        checks.fail(f"{name} changed its argument x ({x.dtype}) in place: write y into a new "
                    "array; the caller may still need x")
    y = checks.as_array(y, f"{name}'s result")
    if y.shape != x.shape:
        checks.fail(f"{name} returned shape {y.shape} for x of shape {x.shape}: y has x's shape")
    if y.dtype != x.dtype:
        checks.fail(f"{name} returned {y.dtype} for {x.dtype} x: the docstring promises x's "
                    "dtype (no astype, no float64 constants)")
    return y


def _quietly(diagnose, *args):
    """A probe's hint, or None when the probe itself fails (a function missing or not done)."""
    try:
        return diagnose(*args)
    except Exception:
        return None


def _softmax_diagnose(impl, name):
    """Tiny float64 probes for three_pass_softmax or online_softmax: the first hint that fits."""
    def wrong(x, block_size):
        y = _call_softmax(impl, name, x, block_size)
        return not np.allclose(y, _softmax(x), rtol=1e-6, atol=1e-12)

    x = np.random.default_rng(2).standard_normal((2, 24))
    y = _call_softmax(impl, name, x + np.eye(24)[-1] * 800, 4)   # the max last, far above
    if not np.all(np.isfinite(y)) and not wrong(x, 4):
        return HINT_MAX
    if wrong(x[:, 1:] + np.eye(23)[-1] * 800, 5) and not wrong(x + np.eye(24)[-1] * 800, 4):
        return (f"with N = 23 and block_size = 5 your {name} mishandles the last, shorter block "
                "(columns 20-22): some sweep misses it, or the max of the row leaves it out. "
                "Loop over range(0, N, block_size); x[..., start:start + block_size] gives the "
                "shorter last block by itself")
    rising = np.sort(x, axis=-1)
    if name == "online_softmax" and wrong(rising, 1) and not wrong(rising[:, ::-1].copy(), 1):
        return (_quietly(_diagnose, impl) or "right when the max comes first, wrong when it grows "
                "from block to block: rescale d by exp(m_old - m_new) before adding the new "
                "block's terms")
    if not np.allclose(y.sum(axis=-1), 1.0, rtol=1e-6):
        return ("your rows do not sum to 1: every block's y must use the same m and d, those of "
                "the whole row (the max over every block, and the sum over every block of "
                "exp(x - m)), not the max or the sum of its own block")
    if wrong(1000 + np.random.default_rng(3).uniform(0, 5, (1, 7)), 3):
        return HINT_MAX
    y = _call_softmax(impl, name, MASKED_PROBE, 2)
    if np.isnan(y[0]).any():
        return HINT_EMPTY_ROW
    if np.isnan(y).any():
        return HINT_LEADING
    return None


def _expect_softmax(impl, name, x, block_size, default_hint):
    y = _call_softmax(impl, name, x, block_size)
    what = f"{name}({x.dtype} x of shape {x.shape}, block_size={block_size})"
    hint = lambda: _quietly(_softmax_diagnose, impl, name) or default_hint  # noqa: E731
    if np.isnan(y).any():
        rows = sorted(set(np.argwhere(np.isnan(y.reshape(-1, x.shape[-1])))[:, 0].tolist()))
        checks.fail(f"{what} has NaN in rows {rows[:8]} (of {y.size // x.shape[-1]})", hint())
    masked = np.isneginf(x)
    if np.any(y[masked] != 0):
        checks.fail(f"{what} is {y[masked][y[masked] != 0][0]:.3g}, not 0, at a -inf entry of x",
                    "a masked score (-inf) has weight exactly 0: exp(-inf - m) = 0 for any "
                    "finite m; a row of -inf only is all 0")
    checks.expect_close(y, _softmax(x.astype(np.float64)), baseline=(_softmax(x), _log_space(x)),
                        dtype=x.dtype, name=what, hint=hint)


def check_softmax_random(impl, rng):
    """three_pass_softmax and online_softmax: random rows, any block size (float32, float64)"""
    for name in SOFTMAXES:
        for dtype in DTYPES:
            for shape, sizes in (((9, 97), (1, 16, 97, 200)), ((2, 3, 17), (5,)), ((4, 1), (3,))):
                x = (3 * rng.standard_normal(shape)).astype(dtype)
                for block_size in sizes:
                    _expect_softmax(impl, name, x, block_size,
                                    "y = exp(x - m) / d, with m and d those of the whole row")


def check_softmax_masked(impl, rng):
    """three_pass_softmax and online_softmax: -inf entries get 0, a row of -inf only is all 0"""
    for name in SOFTMAXES:
        for dtype in DTYPES:
            x = _masked_rows(rng, dtype)
            for block_size in (8, 13):
                _expect_softmax(impl, name, x, block_size, HINT_LEADING)


def check_softmax_large(impl, rng):
    """three_pass_softmax and online_softmax: scores in the thousands, the max in the last block"""
    for name in SOFTMAXES:
        for dtype, scale in ((np.float32, 2e3), (np.float64, 2e4)):
            x = rng.uniform(-scale, scale, (9, 97))
            x[:, -1] = x.max(axis=-1) + rng.uniform(100, 200, 9)     # past exp's range, last
            x[1] -= 3 * scale                                         # a row far below 0
            _expect_softmax(impl, name, x.astype(dtype), 10, HINT_MAX)


@checks.not_under_grade
def check_softmax_sweeps(impl, rng):
    """three_pass_softmax reads x in three sweeps, online_softmax in two, a block at a time"""
    for name, want in zip(SOFTMAXES, (3, 2)):
        # never a power of two, and many blocks: a sweep is clearly more than a block
        n, block_size = int(rng.integers(1000, 1100)), int(rng.choice([7, 48, 100]))
        x = (3 * rng.standard_normal((4, n))).astype(np.float32)
        x[:, -1] = x.max(axis=-1) + 150                       # the max comes last, past exp's range
        row = _Row(x.copy(), axis=-1)
        checks.function(impl, name)(row, block_size)
        times, largest = _sweeps(row.reads, n)
        what = f"for rows of {n} and block_size={block_size}, your {name}"
        if largest > block_size:
            checks.fail(f"{what} reads {largest} columns of x at once",
                        "read x only a block at a time, x[..., start:start + block_size]: an "
                        "operation on x itself (x.max(...), np.exp(x - m), x - m, np.asarray(x)) "
                        "reads the whole row, which a long row in HBM does not allow")
        if not want - 1 < times <= want:
            if name == "three_pass_softmax":
                advice = ("three sweeps over the blocks: the max, then the sum of exp(x - m), "
                          "then y; each reads every block of x once")
            else:
                advice = ("two sweeps over the blocks: the running max and the rescaled sum "
                          "together in the first, y in the second; each reads every block of x "
                          "once")
            checks.fail(f"{what} reads x {times:.2f} times over, not {want}", advice)
        _expect_softmax(impl, name, x, block_size, "the max is in the last block")


CHECKS = [check_random_rows, check_growing_max, check_max_first, check_shorter_last_block,
          check_large_values, check_one_pass, check_memory, check_normalizer_masked,
          check_softmax_random, check_softmax_masked, check_softmax_large, check_softmax_sweeps]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex02(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
