"""Grader of exercise 02 (lesson 02): online_normalizer(x, block_size) -> (m, d).

(m, d) must equal the row max and sum(exp(x - m)) in float64 under flashlib.testing's rule
(baseline: the three-pass computation in the same dtype, or flashlib's own online version when
that rounds more), for block sizes that divide N, that do not, and that exceed it, on rows whose
max grows block after block, comes first, or sits past exp's overflow point. Tiny probes
([0, 1] and [1, 0] one element at a time, a row of 23 in blocks of 5) name the mistake.
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
FLASHLIB_ANSWERS = ("flashlib.teach.softmax.online_normalizer", "flashlib.teach.softmax.merge_states")

DTYPES = (np.float32, np.float64)


def _reference(x):
    x64 = x.astype(np.float64)
    m = x64.max(axis=-1, keepdims=True)
    return m, np.exp(x64 - m).sum(axis=-1, keepdims=True)


def _three_pass(x):
    m = x.max(axis=-1, keepdims=True)
    return m, np.exp(x - m).sum(axis=-1, keepdims=True)


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
    return None


def _expect(impl, x, block_size, default_hint):
    m, d = _call(impl, x, block_size)
    m_ref, d_ref = _reference(x)
    m_b, d_b = _three_pass(x)
    m_lib, d_lib = library_normalizer(x, block_size)
    what = f"{x.dtype} x of shape {x.shape}, block_size={block_size}"
    hint = lambda: _diagnose(impl) or default_hint  # noqa: E731
    checks.expect_close(m, m_ref, baseline=m_b, dtype=x.dtype, name=f"m for {what}", hint=hint)
    checks.expect_close(d, d_ref, baseline=(d_b, d_lib),
                        dtype=x.dtype, name=f"d for {what}", hint=hint)


def check_random_rows(impl, rng):
    """random rows, block sizes that divide N (float32 and float64)"""
    for dtype in DTYPES:
        for shape, sizes in (((9, 96), (1, 4, 32)), ((2, 3, 17), (1, 17))):
            x = (3 * rng.standard_normal(shape)).astype(dtype)
            for block_size in sizes:
                _expect(impl, x, block_size, "follow the update in the docstring")


def check_growing_max(impl, rng):
    """the max grows from block to block (rows sorted ascending): d is rescaled"""
    for dtype in DTYPES:
        x = np.sort(3 * rng.standard_normal((9, 65)), axis=-1).astype(dtype)
        for block_size in (1, 8):
            _expect(impl, x, block_size, "when the max grows, d' <- d' * exp(m_old - m_new) + "
                    "sum(exp(block - m_new))")


def check_max_first(impl, rng):
    """the max comes first, smaller values after: m is the running max"""
    for dtype in DTYPES:
        x = -np.sort(3 * rng.standard_normal((9, 65)), axis=-1).astype(dtype)
        for block_size in (1, 8):
            _expect(impl, x, block_size, "m_new = max(m_old, block max): m never decreases")


def check_shorter_last_block(impl, rng):
    """block sizes that do not divide N, N = 1, and block_size > N"""
    for dtype in DTYPES:
        for shape, sizes in (((9, 97), (5, 16)), ((4, 1), (1, 3)), ((9, 17), (200,))):
            x = (3 * rng.standard_normal(shape)).astype(dtype)
            for block_size in sizes:
                _expect(impl, x, block_size, "the last block may be shorter than block_size")


def check_large_values(impl, rng):
    """large inputs (past exp's overflow point) stay finite"""
    for dtype, offset in ((np.float32, 100.0), (np.float64, 1000.0)):
        x = (offset + rng.uniform(0, 20, (9, 40))).astype(dtype)
        _expect(impl, x, 7, "every exponent must be <= 0: subtract the running max")


def check_one_pass(impl, rng):
    """one pass over each row, block_size columns at a time (rows of 1000+, max in the last block)"""
    for dtype in DTYPES:
        # never a power of two: a loop that rounds the block up to one reads more than asked
        n, block_size = int(rng.integers(1000, 1100)), int(rng.choice([7, 48, 100]))
        x = (3 * rng.standard_normal((4, n))).astype(dtype)
        x[:, -1] = x.max(axis=-1) + 150           # the max comes last, past exp's range (float32)
        x[1] -= 3e4                                # a row far below 0
        x = x.astype(dtype)
        rec = checks.ReadRecorder(x.copy(), axis=-1)
        result = checks.function(impl, "online_normalizer")(rec, block_size)
        why = checks.stream_problem(rec.reads, n, block_size)
        if why is not None:
            checks.fail(f"for a row of {n} and block_size={block_size}, your online_normalizer "
                        f"is not one pass in blocks: {why}",
                        "read x one block at a time, x[..., start:start + block_size], in order, "
                        "and fold each block into the running (m, d) before the next; a max over "
                        "the whole row (x.max, np.max(x), x.T ...) or a second loop is the "
                        "two-pass softmax this exercise replaces")
        del result
        _expect(impl, x, block_size, "the max is in the last block: rescale d when it comes")


@checks.not_under_grade
def check_memory(impl, rng):
    """memory stays O(block_size) as the rows grow (no buffer of the blocks already read)"""
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


CHECKS = [check_random_rows, check_growing_max, check_max_first, check_shorter_last_block,
          check_large_values, check_one_pass, check_memory]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex02(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
