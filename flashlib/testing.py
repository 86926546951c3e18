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


def assert_attention_close(out, lse, q, k, v, *, causal=False, scale=None, reference=None, name="out"):
    """Check a kernel's ``(out, lse)`` against the float64 oracle; return out's max error.

    out must have q's shape and dtype and lse shape (B, Hq, Nq); out within the rule above (the
    baseline: ``attention_naive`` in q's dtype); lse -inf on exactly the rows with no key to
    attend to and within float32 rounding elsewhere. reference: ``attention_ref``'s
    ``(out, lse)`` when the caller already has it (e.g. with autograd, for the gradients).
    """
    from .reference import attention_naive, attention_ref

    B, Hq, Nq, _ = q.shape
    if out.shape != q.shape or out.dtype != q.dtype or tuple(lse.shape) != (B, Hq, Nq):
        raise AssertionError(f"{name}: out {tuple(out.shape)} {out.dtype} and lse {tuple(lse.shape)}; "
                             f"expected {tuple(q.shape)} {q.dtype} and {(B, Hq, Nq)}")
    with torch.no_grad():
        ref, ref_lse = attention_ref(q, k, v, causal=causal, scale=scale) if reference is None else reference
        base = attention_naive(q, k, v, causal=causal, scale=scale)
    err = assert_close(out, ref, baseline=base, dtype=q.dtype, name=name)
    if not torch.equal(torch.isinf(lse).cpu(), torch.isinf(ref_lse).cpu()):
        raise AssertionError(f"lse of {name}: -inf (no key to attend to) in the wrong rows")
    assert_close(lse, ref_lse, baseline=ref_lse.float(), dtype=torch.float32, name=f"lse of {name}")
    return err
