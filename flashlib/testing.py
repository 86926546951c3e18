"""The one tolerance rule, used by every test, grader and benchmark check.

An implementation in some dtype is right when its error against the float64 oracle is at most
about twice the error of a naive implementation in the same dtype (DESIGN.md, "Exercises and
grading"). Tolerances therefore follow the dtype and the problem, instead of being tuned by hand.
"""
import numpy as np
import torch

FACTOR = 2.0


def _as_numpy64(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def max_error(actual, expected) -> float:
    """Max absolute difference; inf where one side is -inf/inf/nan and the other is not."""
    a, e = _as_numpy64(actual), _as_numpy64(expected)
    if a.shape != e.shape:
        raise AssertionError(f"shape {a.shape} != expected shape {e.shape}")
    same_inf = (a == e)  # -inf == -inf (empty rows' lse) counts as exact
    with np.errstate(invalid="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(a - e))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max()) if diff.size else 0.0


def error_floor(dtype, expected) -> float:
    """Smallest tolerance worth asking for: a few ulps of the dtype at the reference's scale."""
    eps = float(torch.finfo(dtype).eps) if isinstance(dtype, torch.dtype) else float(np.finfo(dtype).eps)
    e = _as_numpy64(expected)
    finite = e[np.isfinite(e)]
    magnitude = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    return 4.0 * eps * magnitude


def tolerance(expected, baseline, dtype) -> float:
    """FACTOR x the naive implementation's error in ``dtype``, never below a few ulps.

    baseline: one result, or a tuple/list of results from several simple, correct
    implementations in ``dtype``; the one that errs most sets the bar. A second baseline matters
    where the algorithm itself rounds differently: with a single key, the exact dQ is 0 and
    autograd gets exactly 0, while FlashAttention's D = rowsum(dO * O) leaves a few ulps.
    """
    baselines = baseline if isinstance(baseline, (tuple, list)) else (baseline,)
    worst = max(max_error(b, expected) for b in baselines)
    return FACTOR * max(worst, error_floor(dtype, expected))


def assert_close(actual, expected, *, baseline, dtype=None, name="output"):
    """Assert ``actual`` is within the dtype's tolerance of the float64 ``expected``.

    baseline: the same quantity from a naive implementation in the same dtype as ``actual``
    (or a tuple of several, see ``tolerance``).
    """
    if dtype is None:
        dtype = actual.dtype
    err = max_error(actual, expected)
    tol = tolerance(expected, baseline, dtype)
    if not err <= tol:
        raise AssertionError(f"{name}: max error {err:.3g} against the float64 reference is over "
                             f"the tolerance {tol:.3g} (2x a naive {dtype} implementation's error)")
    return err
