"""The one tolerance rule, used by every test, grader and benchmark check.

An implementation in some dtype is right when its max error against the float64 oracle is at
most ``FACTOR`` (2) times the larger of

1. the error of a naive implementation in the same dtype (the baseline: textbook attention,
   autograd, ...), so tolerances follow the dtype and the problem instead of being tuned by hand;
2. a floor computed from the inputs, never from a baseline: ``ULPS`` (4) units of rounding at
   the scale of what the computation adds up, that is the larger of

   - ulps of the dtype at the result's own scale (max |expected|, at least 1): storing the
     result in that dtype costs that much whatever the algorithm;
   - ulps of the accumulation precision (float32 for float16/bfloat16/float32 inputs, whose
     kernels all accumulate in float32; float64 for float64) times ``magnitude``, the size of the
     terms whose sum gives the result (see ``attention_magnitudes``).

Why the floor scales with the terms and not with the result: where terms cancel, the result is
small but its rounding error is not. With a single key the exact dQ is 0, computed as
P (dP - D) K with dP = dO.v and D = rowsum(dO * O) two dot products of about |dO||v| that cancel:
any order of summation leaves a few ulps of |dO||v| |K| scale, and whether a naive baseline lands
on exactly 0 (autograd does) or on 1e-6 depends on the BLAS, its kernels for this CPU and its
thread count. A bar of "2x the baseline" alone is then rounding luck; the floor is not.

The size of the terms is the first-order bound of a sum's rounding error, |error| <= n eps
sum |terms| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1; eps
the machine epsilon), without the factor n. Correct float32 implementations measured on CPU (tiled in NumPy at two
block sizes, unfused, autograd; one and two OpenBLAS threads, Haswell and SkylakeX kernels; one
key, causal, scale up to 40) erred at most 0.9 eps x magnitude for out and lse and 0.6 eps x
magnitude for the gradients, against the floor's 4 (and FACTOR 2 on top).

What the floor still catches: in float32 at head dim 80 it comes to about 1e-4 of a gradient's
largest entry at N ~ 100 and 3e-4 at N ~ 1000 (sums of absolute values grow with N faster than
rounding errors do), and 1e-5 to 4e-5 of the output's: a gradient off by 1e-3 relative, a
missing rescale or a wrong scale fails (tests/test_testing.py; every mutant in tests/mutants/
still fails). Limits: the bound is a model (first order, no factor n), not a proof; the error
is one max over the whole tensor, the floor one max of the terms' size.
"""
import math

import numpy as np
import torch

FACTOR = 2.0
ULPS = 4.0


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


def _eps(dtype) -> float:
    return float(torch.finfo(dtype).eps) if isinstance(dtype, torch.dtype) else float(np.finfo(dtype).eps)


def accumulation_eps(dtype) -> float:
    """Unit roundoff of the precision sums are kept in: float64's for 64-bit, else float32's."""
    return _eps(np.float64) if _eps(dtype) <= _eps(np.float64) else _eps(np.float32)


def error_floor(dtype, expected, magnitude=None) -> float:
    """Smallest error worth failing on: ULPS ulps of ``dtype`` at the result's scale (at least 1),
    or ULPS ulps of the accumulation precision times ``magnitude`` (the size of the summed
    terms), whichever is larger. From the inputs only; see the module docstring."""
    e = _as_numpy64(expected)
    finite = e[np.isfinite(e)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    terms = 0.0 if magnitude is None else float(magnitude)
    if not terms >= 0.0:
        raise ValueError(f"magnitude must be a number >= 0, got {magnitude!r}")
    return ULPS * max(_eps(dtype) * scale, accumulation_eps(dtype) * terms)


def tolerance(expected, baseline, dtype, *, magnitude=None, method_error=0.0) -> float:
    """FACTOR x the largest of the naive implementation's error in ``dtype``, ``error_floor`` and
    ``method_error``.

    baseline: one result, or a tuple/list of results from several simple, correct
    implementations in ``dtype``; the one that errs most counts. magnitude: the size of the terms
    summed to make ``expected`` (``attention_magnitudes``); None: no cancellation to allow for.
    method_error: a bound on the error of an approximation the implementation makes on purpose
    (the GPU's one-instruction tanh in a bfloat16 softcap), beyond rounding.
    """
    baselines = baseline if isinstance(baseline, (tuple, list)) else (baseline,)
    worst = max(max_error(b, expected) for b in baselines)
    return FACTOR * max(worst, error_floor(dtype, expected, magnitude), method_error)


def assert_close(actual, expected, *, baseline, dtype=None, name="output", magnitude=None, method_error=0.0):
    """Assert ``actual`` is within the dtype's tolerance of the float64 ``expected``.

    baseline: the same quantity from a naive implementation in the same dtype as ``actual``
    (or a tuple of several, see ``tolerance``). magnitude, method_error: see ``tolerance``.
    Returns the error.
    """
    if dtype is None:
        dtype = actual.dtype
    err = max_error(actual, expected)
    tol = tolerance(expected, baseline, dtype, magnitude=magnitude, method_error=method_error)
    if not err <= tol:
        raise AssertionError(f"{name}: max error {err:.3g} against the float64 reference is over "
                             f"the tolerance {tol:.3g} (2x a naive {dtype} implementation's "
                             f"error, or 2x {ULPS:g} ulps at the scale of the terms summed)")
    return err


def attention_magnitudes(q, k, v, dout=None, *, causal=False, scale=None, mask=None, softcap=None,
                         alibi_slopes=None) -> dict:
    """The scale of the terms summed into attention's results, for ``tolerance(magnitude=...)``.

    Returns {"out", "lse"} (and {"dq", "dk", "dv"} with ``dout``) as floats, each the max over
    the tensor of a first-order bound of that result's rounding error in units of the
    accumulation precision, from the float64 inputs (torch tensors or NumPy arrays; grouped heads,
    ``causal``, ``scale``, ``mask``, ``softcap`` and ``alibi_slopes`` as in ``attention_ref``):

    - a score s = scale q.k is rounded by about |scale| |q|.|k| =: A (B, H, Nq, Nk), so each P_ij
      carries a relative error of about w_ij = 1 + A_ij (1 for exp) plus its row's shared part
      sum_j P_ij w_ij (through the max and the normaliser); a softcap does not add to it (its
      slope is at most 1), ALiBi's bias adds its own size |b_ij| to A_ij;
    - out_i = sum_j P_ij v_j: P |v| (the sum itself) plus sum_j P_ij w_ij |v_j - out_i| (P's error;
      0 with one key, where P = 1 whatever the rounding), bounded by Cauchy-Schwarz;
    - dS = P (dP - D), dP = dO.v and D = dO.out: P (|dO|.|v| + |dO|.|out| + out's error) for the
      cancellation, plus P's error times |dP - D|;
    - dq = scale dS K, dk = scale dS^T Q, dv = P^T dO: the same products with absolute values.

    Costs a few (B, H, rows, Nk) float64 matrices per chunk of query rows, like ``attention_ref``.
    """
    from .inputs import check_qkv, resolve_scale
    from .reference import CHUNK_ELEMENTS, causal_mask, modify_scores

    as64 = lambda t: None if t is None else torch.as_tensor(t).detach().to(torch.float64)  # noqa: E731
    q, k, v, dout = as64(q), as64(k), as64(v), as64(dout)
    B, Hq, Hkv, Nq, Nk, D = check_qkv(q, k, v)
    scale = resolve_scale(scale, D)
    group = Hq // Hkv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, Hq, Nk, D)
    if mask is not None:
        mask = torch.as_tensor(mask, device=q.device).broadcast_to(B, Hq, Nq, Nk)
    mags = dict(out=0.0, lse=0.0)
    if dout is not None:
        mags.update(dq=0.0)
        dk_mag, dv_mag = torch.zeros_like(k), torch.zeros_like(v)                 # (B, Hq, Nk, D)
    rows = max(1, CHUNK_ELEMENTS // max(1, B * Hq * Nk))
    for start in range(0, Nq, rows):
        stop = min(Nq, start + rows)
        qc = q[:, :, start:stop]                                                   # (B, Hq, n, D)
        s = (qc @ k.transpose(-1, -2)) * scale                                     # (B, Hq, n, Nk)
        a = (qc.abs() @ k.abs().transpose(-1, -2)) * abs(scale)                    # (B, Hq, n, Nk)
        q_pos = torch.arange(start, stop) + (Nk - Nq)
        s = modify_scores(s, q_pos, softcap=softcap, alibi_slopes=alibi_slopes)
        if alibi_slopes is not None:                                               # + |bias|
            a = a + modify_scores(torch.zeros_like(a), q_pos, alibi_slopes=alibi_slopes).abs()
        allowed = torch.ones_like(s, dtype=torch.bool)
        if causal:
            allowed = allowed & causal_mask(Nq, Nk, q.device)[start:stop]
        if mask is not None:
            allowed = allowed & mask[:, :, start:stop]
        s = s.masked_fill(~allowed, -math.inf)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)                             # (B, Hq, n, 1)
        p = torch.where(torch.isfinite(lse), torch.exp(s - lse), 0.0)              # (B, Hq, n, Nk)
        pw = p * (1 + a)                                                           # P_ij w_ij
        shared = pw.sum(-1, keepdim=True)                                          # (B, Hq, n, 1)
        out = p @ v                                                                # (B, Hq, n, D)
        spread = pw @ v.square() - 2 * out * (pw @ v) + shared * out.square()      # sum pw (v - out)^2
        out_mag = p @ v.abs() + (shared * spread.clamp(min=0)).sqrt()              # (B, Hq, n, D)
        lse_mag = torch.where(torch.isfinite(lse), lse.abs(), 0.0) + shared
        mags["out"] = max(mags["out"], out_mag.max().item() if out_mag.numel() else 0.0)
        mags["lse"] = max(mags["lse"], lse_mag.max().item() if lse_mag.numel() else 0.0)
        if dout is None:
            continue
        do = dout[:, :, start:stop]                                                # (B, Hq, n, D)
        dp_minus_d = do @ v.transpose(-1, -2) - (do * out).sum(-1, keepdim=True)  # (B, Hq, n, Nk)
        cancel = (do.abs() @ v.abs().transpose(-1, -2)                           # |dP| terms
                  + (do.abs() * (out.abs() + out_mag)).sum(-1, keepdim=True))      # |D| terms, out's error
        p_err = pw + p * shared                                                    # P's relative error x P
        ds_mag = p * cancel + p_err * dp_minus_d.abs()                             # (B, Hq, n, Nk)
        dq_mag = abs(scale) * ds_mag @ k.abs()                                     # (B, Hq, n, D)
        mags["dq"] = max(mags["dq"], dq_mag.max().item() if dq_mag.numel() else 0.0)
        dk_mag += abs(scale) * ds_mag.transpose(-1, -2) @ qc.abs()
        dv_mag += (p + p_err).transpose(-1, -2) @ do.abs()
    if dout is not None:
        fold = lambda t: t.reshape(B, Hkv, group, Nk, D).sum(2)  # noqa: E731  grouped heads add up
        for name, t in (("dk", fold(dk_mag)), ("dv", fold(dv_mag))):
            mags[name] = t.max().item() if t.numel() else 0.0
    return mags


def assert_attention_close(out, lse, q, k, v, *, causal=False, scale=None, reference=None, name="out",
                           **score_mods):
    """Check a kernel's ``(out, lse)`` against the float64 oracle; return out's max error.

    out must have q's shape and dtype and lse shape (B, Hq, Nq); out within the rule above (the
    baseline: ``attention_naive`` in q's dtype; the floor: ``attention_magnitudes``); lse -inf on
    exactly the rows with no key to attend to and within float32 rounding elsewhere. reference:
    ``attention_ref``'s ``(out, lse)`` when the caller already has it (e.g. with autograd, for
    the gradients). score_mods: ``softcap``, ``alibi_slopes`` as in ``attention_ref``.
    """
    from .reference import attention_naive, attention_ref

    B, Hq, Nq, _ = q.shape
    if out.shape != q.shape or out.dtype != q.dtype or tuple(lse.shape) != (B, Hq, Nq):
        raise AssertionError(f"{name}: out {tuple(out.shape)} {out.dtype} and lse {tuple(lse.shape)}; "
                             f"expected {tuple(q.shape)} {q.dtype} and {(B, Hq, Nq)}")
    with torch.no_grad():
        ref, ref_lse = (attention_ref(q, k, v, causal=causal, scale=scale, **score_mods)
                        if reference is None else reference)
        base = attention_naive(q, k, v, causal=causal, scale=scale, **score_mods)
        mags = attention_magnitudes(q, k, v, causal=causal, scale=scale, **score_mods)
    err = assert_close(out, ref, baseline=base, dtype=q.dtype, name=name, magnitude=mags["out"])
    if not torch.equal(torch.isinf(lse).cpu(), torch.isinf(ref_lse).cpu()):
        raise AssertionError(f"lse of {name}: -inf (no key to attend to) in the wrong rows")
    # the lse is float32 and held to float32's rounding, except for approximations made on purpose
    assert_close(lse, ref_lse, baseline=ref_lse.float(), dtype=torch.float32, name=f"lse of {name}",
                 magnitude=mags["lse"], method_error=lse_method_error(q, score_mods.get("softcap")))
    return err


def lse_method_error(q, softcap):
    """What the lse may err beyond float32's rounding: a bfloat16 softcap on a GPU takes tanh as
    one instruction (relative error <= TANH_APPROX_ERROR), which moves each capped score by at most
    cap x that, and the lse, a log-sum-exp, by no more than its largest score moves; else 0."""
    from . import runtime
    approx = softcap is not None and runtime.approximate_tanh(q.dtype, q.device)
    return softcap * runtime.TANH_APPROX_ERROR if approx else 0.0
