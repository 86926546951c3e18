"""Grader of exercise 01 (lesson 01): safe_softmax(x), the stable three-pass softmax.

Compared with a float64 softmax under flashlib.testing's rule (baselines: flashlib's own safe
softmax in the same dtype, and exp(x - lse) through the log-sum-exp, whose rounding follows |lse|) on irregular shapes, float32 and float64, and on inputs chosen to
break the usual mistakes: values past exp's overflow point (88.72 in float32, 709.78 in
float64), rows whose values spread wider than that, rows far apart from each other. A small
probe (large values close together) tells a missing max subtraction from a wrong one.
"""
import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.teach.softmax import safe_softmax as library_softmax

pytestmark = pytest.mark.ex01
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is
# reached (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.teach.softmax.safe_softmax", "flashlib.teach.softmax.online_softmax")

DTYPES = (np.float32, np.float64)
OVERFLOW = {np.float32: 88.72, np.float64: 709.78}   # exp(x) is inf past these
SHAPES = [(17,), (9, 97), (2, 3, 130), (9, 1)]

HINT_MAX = ("matches only for small inputs: exp(x) overflows past 88.72 in float32 (709.78 in "
            "float64) and inf / inf is NaN; did you subtract the row max before exp?")


def _reference(x):
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _call(impl, x):
    arg = x.copy()
    y = checks.function(impl, "safe_softmax")(arg)
    if not np.array_equal(arg, x):
        checks.fail(f"safe_softmax changed its argument x ({x.dtype}) in place (x -= m, "
                    "np.exp(x, out=x), or astype(..., copy=False), which is x itself when the "
                    "dtype already matches): compute into a new array; the caller may still "
                    "need x")
    y = checks.as_array(y, "safe_softmax's result")
    if y.shape != x.shape:
        checks.fail(f"for x of shape {x.shape} your output has shape {y.shape}: softmax keeps "
                    "the shape (reduce with keepdims=True so the row values broadcast)")
    if y.dtype != x.dtype:
        checks.fail(f"for {x.dtype} input your output is {y.dtype}: compute in the input's "
                    "dtype (no astype), which is where overflow bites")
    return y


def _overflows_when_large(impl):
    """Probe: large values close together (no row spread at all to speak of)."""
    for dtype in DTYPES:
        x = (OVERFLOW[dtype] + 20 + np.random.default_rng(1).uniform(0, 10, (3, 17))).astype(dtype)
        y = _call(impl, x)
        if not np.allclose(y, _reference(x), rtol=1e-3, atol=1e-6):
            return True
    return False


def _row_hint(y, x):
    """Why rows do not sum to 1: a wrong axis, or a wrong normaliser."""
    sums = y.astype(np.float64).sum(axis=-1)
    if np.allclose(sums, 1.0, rtol=1e-3):
        return None
    for axis in range(x.ndim - 1):
        if np.allclose(y.astype(np.float64).sum(axis=axis), 1.0, rtol=1e-3):
            return (f"your values sum to 1 along axis {axis}: softmax here is over the last "
                    "axis (axis=-1, keepdims=True), each row along it sums to 1")
    return ("your rows do not sum to 1: divide exp(x - m) by its sum over the row "
            "(axis=-1), not by its max or anything else")


def _log_space(x):
    """Softmax in log space in x's dtype, exp(x - lse) with lse = np.logaddexp.reduce(x) (stable,
    one rounding of lse per element): the second baseline, whose error follows |lse| and N."""
    return np.exp(x - np.logaddexp.reduce(x, axis=-1, keepdims=True))


def _expect(y, x, name, hint):
    checks.expect_close(y, _reference(x), baseline=(library_softmax(x), _log_space(x)),
                        dtype=x.dtype, name=name, hint=hint)


def check_small_inputs(impl, rng):
    """matches softmax on small inputs (float32 and float64, 1 to 3 axes)"""
    for dtype in DTYPES:
        for shape in SHAPES:
            x = (3 * rng.standard_normal(shape)).astype(dtype)
            y = _call(impl, x)
            _expect(y, x, f"softmax of a {dtype.__name__} array of shape {shape}",
                    lambda: _row_hint(y, x) or "follow the three passes in the docstring")


def check_large_values(impl, rng):
    """large inputs stay finite and right (x > 88.72 in float32, > 709.78 in float64)"""
    for dtype in DTYPES:
        x = (OVERFLOW[dtype] + rng.uniform(1, 20, (9, 97))).astype(dtype)
        y = _call(impl, x)
        _expect(y, x, f"softmax of {dtype.__name__} values in [{x.min():.1f}, {x.max():.1f}]",
                lambda: HINT_MAX if not np.all(np.isfinite(y)) else _row_hint(y, x))


def check_wide_rows(impl, rng):
    """rows whose values spread wider than exp's range (from -L to L)"""
    for dtype in DTYPES:
        lim = 1.5 * OVERFLOW[dtype]
        x = rng.uniform(-lim, lim, (9, 97)).astype(dtype)
        y = _call(impl, x)

        def hint():
            if _overflows_when_large(impl):
                return HINT_MAX
            return ("fails when a row's values are far apart but passes when they are close "
                    "together: exp(x - c) stays <= 1 only when c is the row's max; subtract "
                    "the row's max, not its min or mean")
        _expect(y, x, f"softmax of {dtype.__name__} rows spread over [{-lim:.0f}, {lim:.0f}]", hint)


def check_rows_far_apart(impl, rng):
    """rows far apart from each other: each row subtracts its own max"""
    for dtype in DTYPES:
        offsets = rng.permutation(np.linspace(-2, 2, 9) * OVERFLOW[dtype])
        x = (offsets[:, None] + rng.uniform(0, 5, (9, 33))).astype(dtype)
        y = _call(impl, x)

        def hint():
            if _overflows_when_large(impl):
                return HINT_MAX
            return ("each row must subtract its own max (x.max(axis=-1, keepdims=True)): one "
                    "max for the whole array makes the rows far below it underflow to 0, and "
                    "0 / 0 is NaN")
        _expect(y, x, f"softmax of {dtype.__name__} rows offset by up to "
                f"{np.abs(offsets).max():.0f}", hint)


def check_input_unchanged(impl, rng):
    """leaves its input unchanged and returns its softmax (float32 and float64); a file that
    only leaves x alone earns nothing here"""
    for dtype in DTYPES:
        x = rng.standard_normal((9, 97)).astype(dtype)
        y = _call(impl, x)
        _expect(y, x, f"softmax of a {dtype.__name__} array of shape (9, 97)",
                lambda: _row_hint(y, x) or "follow the three passes in the docstring")


def check_max_in_last_column(impl, rng):
    """rows of 1000+ whose max is the last element, above the rest by more than exp's range"""
    for dtype in DTYPES:
        n = int(rng.integers(1000, 1100))
        x = 3 * rng.standard_normal((5, n))
        x[:, -1] = x[:, :-1].max(axis=-1) + rng.uniform(1.2, 2, 5) * OVERFLOW[dtype]
        x[1] -= 3e4                                        # a row far below 0 as well
        x = x.astype(dtype)
        y = _call(impl, x)
        _expect(y, x, f"softmax of {dtype.__name__} rows of {n} whose last element is the max "
                f"by {x[0, -1] - np.sort(x[0])[-2]:.0f}",
                lambda: ("the max must come from the whole row, the last element too: x.max("
                         "axis=-1, keepdims=True); with any smaller value exp overflows")
                if not np.all(np.isfinite(y)) else _row_hint(y, x))


CHECKS = [check_small_inputs, check_large_values, check_wide_rows, check_rows_far_apart,
          check_input_unchanged, check_max_in_last_column]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex01(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
