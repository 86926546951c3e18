"""Grader of exercise 08 (lesson 08): dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale,
dk_j, dv_j) -> (dk_j, dv_j, ds), one tile of the FlashAttention backward.

First called directly on one tile cut from a longer row (so the tile's P does not sum to 1 and
D must come from O), with a causal-like mask and rows with nothing to attend to, against the
float64 formulas; then plugged into flashlib.teach.tiled.fa2_backward(..., dkdv_update=fn) and compared
with torch.autograd through attention_ref in float64 on irregular shapes (9 heads, head dim 80,
Nq != Nk, block sizes not dividing N, causal with Nq > Nk).

Inputs are float32: a float64 answer has no float64 oracle fine enough to judge it by the 2x
rule. The baseline is the loosest of several correct float32 implementations (the library's
tile step, the kernel's base-2 arithmetic, the unfused formulas, torch's own autograd), and the
floor follows the size of the terms summed (flashlib.testing.attention_magnitudes, and its model
for one tile in _tile_magnitudes), so a correct answer that rounds in another order passes under
every seed (tests/test_mutants.py). Probes name the mistake: NaN on
empty rows, mask forgotten, lse taken as base 2, D missing or taken from the tile's P, scale
missing on dK, no accumulation.
"""
import math

import numpy as np
import pytest
import torch

from flashlib.course import checks, grading
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import attention_magnitudes
from flashlib.teach.tiled import fa2_backward, fa2_dkdv_update as library_update, fa2_forward

pytestmark = pytest.mark.ex08
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is
# reached (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.teach.tiled.fa2_dkdv_update",)

HINT_NAN = ("a row with nothing to attend to has lse = -inf, and exp(-inf - (-inf)) is NaN: use "
            "0 instead of -inf as that row's lse, so that its P is 0")
HINT_MASK = ("P is not 0 where the mask is False: set the scores to -inf where mask is False "
             "before exp (np.where(mask, s, -np.inf)); the backward must see the forward's mask")
HINT_BASE2 = ("lse is a natural log: P = exp(S - lse). (A kernel working in base 2 uses "
              "exp2(S * log2(e) - lse * log2(e)): both sides converted)")
HINT_P = "dV is wrong: recompute P = exp(scale * Q K^T - lse) and add P^T dO (a (Bk, D) matrix)"
HINT_NO_D = ("dS = P * (dP - D): you left out D = rowsum(dO * O), softmax's backward term for "
             "the whole row")
HINT_D_FROM_P = ("D must be rowsum(dO * O), not rowsum(P * dP) of this tile: the tile holds only "
                 "some of the row's keys, so its P does not sum to 1 (equal only over the whole "
                 "row)")
HINT_DS = "dS is wrong: dP = dO V^T (Bq, Bk), then dS = P * (dP - D[:, None])"
HINT_SCALE = ("dK lacks the softmax scale: S = scale * Q K^T, so dK += scale * dS^T Q (and dS "
              "itself is returned without the scale: the caller scales dQ)")
HINT_ACCUMULATE = ("add to dk_j and dv_j (they hold earlier query blocks' sums): return "
                   "dk_j + ..., dv_j + ..., do not start from zero")
HINT_DK = "dK is wrong: dK += scale * dS^T Q, a (Bk, D) matrix"

NAMES = ("dk_j", "dv_j", "ds")


def _formulas(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j, *, base2=False,
              use_mask=True, delta="o", dk_scale=True, accumulate=True):
    """The step in float64; the keywords build the wrong variants the hints recognise."""
    q_i, k_j, v_j, o_i, do_i, lse_i, dk_j, dv_j = (
        np.asarray(t, np.float64) for t in (q_i, k_j, v_j, o_i, do_i, lse_i, dk_j, dv_j))
    s = scale * (q_i @ np.swapaxes(k_j, -1, -2))                    # (..., Bq, Bk)
    if use_mask:
        s = np.where(mask, s, -np.inf)
    lse = np.where(np.isneginf(lse_i), 0.0, lse_i)[..., None]
    p = np.exp2(s * math.log2(math.e) - lse) if base2 else np.exp(s - lse)
    dp = do_i @ np.swapaxes(v_j, -1, -2)                            # (..., Bq, Bk)
    d = {"o": (do_i * o_i).sum(-1), "p": (p * dp).sum(-1), "none": np.zeros(lse_i.shape)}[delta]
    ds = p * (dp - d[..., None])
    dk = (scale if dk_scale else 1.0) * (np.swapaxes(ds, -1, -2) @ q_i)
    dv = np.swapaxes(p, -1, -2) @ do_i
    return (dk_j + dk, dv_j + dv, ds) if accumulate else (dk, dv, ds)


def _tile_magnitudes(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    """{name: size of the terms summed into it} for dk_j, dv_j, ds (expect_close's magnitude):
    flashlib.testing.attention_magnitudes' model for one tile whose lse and O are given. P_ij
    carries a relative rounding error of about w_ij = 1 + |scale| |q_i|.|k_j| + |lse_i| (the
    score's rounding and lse's); dS = P (dP - D) cancels terms of |dO|.|v| and |dO|.|O|."""
    q_i, k_j, v_j, o_i, do_i, lse_i, dk_j, dv_j = (
        np.asarray(t, np.float64) for t in (q_i, k_j, v_j, o_i, do_i, lse_i, dk_j, dv_j))
    kT = lambda t: np.swapaxes(t, -1, -2)  # noqa: E731
    s = np.where(mask, scale * (q_i @ kT(k_j)), -np.inf)                     # (..., Bq, Bk)
    finite = np.isfinite(lse_i)[..., None]
    p = np.where(finite, np.exp(s - np.where(finite, lse_i[..., None], 0.0)), 0.0)
    w = 1 + abs(scale) * (np.abs(q_i) @ kT(np.abs(k_j))) + np.abs(np.where(finite, lse_i[..., None], 0))
    dp_minus_d = do_i @ kT(v_j) - (do_i * o_i).sum(-1)[..., None]             # (..., Bq, Bk)
    cancel = np.abs(do_i) @ kT(np.abs(v_j)) + (np.abs(do_i) * np.abs(o_i)).sum(-1)[..., None]
    ds = p * cancel + p * w * np.abs(dp_minus_d)                             # (..., Bq, Bk)
    dk = np.abs(dk_j) + abs(scale) * kT(ds) @ np.abs(q_i)                   # (..., Bk, D)
    dv = np.abs(dv_j) + kT(p * (1 + w)) @ np.abs(do_i)                       # (..., Bk, D)
    return {"dk_j": dk.max(), "dv_j": dv.max(), "ds": ds.max()}


def _base2_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    """A correct step that rounds more, in the inputs' dtype: the scale folded into a copy of q
    (rounded), base-2 scores from a second multiply (rounded again: at scores near -30000 each
    rounding moves P by ~0.4%), lse converted to base 2, and np.einsum's plain summation loops in
    place of BLAS's blocked sums, as a learner may well write it."""
    t = q_i.dtype.type
    qs = q_i * t(scale)                                               # (..., Bq, D)
    s2 = np.einsum("...qd,...kd->...qk", qs, k_j) * t(math.log2(math.e))
    s2 = np.where(mask, s2, -np.inf)                                  # (..., Bq, Bk)
    lse2 = np.where(np.isneginf(lse_i), np.inf, lse_i * t(math.log2(math.e)))  # +inf: P = 0
    p = np.exp2(s2 - lse2[..., None])                                 # (..., Bq, Bk)
    dp = np.einsum("...qd,...kd->...qk", do_i, v_j)                   # (..., Bq, Bk)
    ds = p * (dp - np.einsum("...qd,...qd->...q", do_i, o_i)[..., None])
    dk = np.einsum("...qk,...qd->...kd", ds, qs)
    return dk_j + dk, dv_j + np.einsum("...qk,...qd->...kd", p, do_i), ds


def _call(impl, args):
    copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    result = checks.function(impl, "dkdv_update")(*copies)
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        checks.fail(f"dkdv_update returned {type(result).__name__}; it should return the triple "
                    "(dk_j, dv_j, ds)")
    names = ("q_i", "k_j", "v_j", "o_i", "do_i", "lse_i", "mask", "scale", "dk_j", "dv_j")
    for name, before, after in zip(names, args, copies):
        if isinstance(before, np.ndarray) and not np.array_equal(before, after, equal_nan=True):
            checks.fail(f"dkdv_update changed its argument {name} in place (e.g. dk_j += ...): "
                        "return new arrays instead (dk_j = dk_j + ...)")
    out = tuple(checks.as_array(t, name) for t, name in zip(result, NAMES))
    Bq, Bk = args[6].shape
    expected = (args[8].shape, args[9].shape, args[0].shape[:-2] + (Bq, Bk))
    for name, got, want in zip(NAMES, out, expected):
        if got.shape != want:
            checks.fail(f"{name} has shape {got.shape}; expected {want}")
    return out


def _tile(rng, dtype, *, lead=(2, 3), Bq=16, Bk=24, D=80, empty_rows=0):
    """Arguments for one tile: the middle key block of a 3-block row, so that P over the tile
    does not sum to 1. Row r sees keys j <= Bk + 2 r - 4 of the row (a causal band crossing the
    tile); the first ``empty_rows`` rows see no key at all (lse = -inf). Random dk_j, dv_j: the
    sums of earlier query blocks."""
    scale = 1 / math.sqrt(D)
    q = rng.standard_normal(lead + (Bq, D))
    k_all, v_all = (rng.standard_normal(lead + (3 * Bk, D)) for _ in range(2))
    visible = np.arange(3 * Bk)[None, :] <= Bk + 2 * np.arange(Bq)[:, None] - 4   # (Bq, 3 Bk)
    visible[:empty_rows] = False
    s = np.where(visible, scale * (q @ np.swapaxes(k_all, -1, -2)), -np.inf)     # (..., Bq, 3Bk)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    z = np.exp(s - m).sum(-1)
    lse = np.where(z > 0, m[..., 0] + np.log(np.where(z > 0, z, 1.0)), -np.inf)   # (..., Bq)
    out = np.exp(s - np.where(np.isneginf(lse), 0.0, lse)[..., None]) @ v_all    # (..., Bq, D)
    dout = rng.standard_normal(out.shape)
    dk_j, dv_j = (rng.standard_normal(lead + (Bk, D)) for _ in range(2))
    tile = slice(Bk, 2 * Bk)
    args = [q, k_all[..., tile, :], v_all[..., tile, :], out, dout, lse]
    return [t.astype(dtype) for t in args] + [visible[:, tile], scale] + \
           [dk_j.astype(dtype), dv_j.astype(dtype)]


def _close(a, b):
    return np.allclose(a, b, rtol=1e-4, atol=1e-5)


def _tile_hint(args, got):
    """Which output is wrong, and the likely reason."""
    dk, dv, ds = got
    if any(np.isnan(t).any() for t in got):
        return HINT_NAN
    ref_dk, ref_dv, ref_ds = _formulas(*args)
    if not _close(dv, ref_dv):
        if _close(dv, _formulas(*args, use_mask=False)[1]):
            return HINT_MASK
        if _close(dv, _formulas(*args, base2=True)[1]):
            return HINT_BASE2
        if _close(dv, _formulas(*args, accumulate=False)[1]):
            return HINT_ACCUMULATE
        return HINT_P
    if not _close(ds, ref_ds):
        if _close(ds, _formulas(*args, delta="none")[2]):
            return HINT_NO_D
        if _close(ds, _formulas(*args, delta="p")[2]):
            return HINT_D_FROM_P
        return HINT_DS
    if not _close(dk, ref_dk):
        if _close(dk, _formulas(*args, dk_scale=False)[0]):
            return HINT_SCALE
        if _close(dk, _formulas(*args, accumulate=False)[0]):
            return HINT_ACCUMULATE
        return HINT_DK
    return None


def _diagnose(impl):
    args = _tile(np.random.default_rng(8), np.float64, empty_rows=2)
    return _tile_hint(args, _call(impl, args))


def _expect_tile(impl, rng, *, empty_rows, what):
    args = _tile(rng, np.float32, empty_rows=empty_rows)
    got = _call(impl, args)
    expected = _formulas(*args)
    library, base2 = library_update(*args), _base2_update(*args)
    magnitude = _tile_magnitudes(*args)
    for name, g, e, b1, b2 in zip(NAMES, got, expected, library, base2):
        b = (b1, b2)  # the loosest of the two sets the tolerance
        if np.isnan(g).any():
            checks.fail(f"{name} has NaN ({what})",
                        _tile_hint(args, got) or HINT_NAN)
        checks.expect_close(g, e, baseline=b, dtype=np.dtype(np.float32),
                            name=f"{name} ({what})", hint=lambda: _tile_hint(args, got),
                            magnitude=magnitude[name])
    return args, got


def check_one_tile(impl, rng):
    """one tile matches the formulas (direct call: causal band across the tile, float32)"""
    _expect_tile(impl, rng, empty_rows=0, what="one float32 tile of shape (2, 3, 16, 24)")


def check_empty_rows(impl, rng):
    """rows with nothing to attend to (lse = -inf) give no NaN and add nothing"""
    args, got = _expect_tile(impl, rng, empty_rows=3,
                             what="rows 0-2 of the tile have lse = -inf")
    if np.abs(got[2][..., :3, :]).max() != 0:
        checks.fail("ds is not 0 on rows 0-2, whose lse is -inf (they attend to nothing)",
                    HINT_NAN)


HINT_EXPONENT = ("your step overflows where the maths does not. Set the masked scores to -inf "
                 "before exp (np.where(mask, S, -np.inf)): a mask applied after exp multiplies "
                 "an inf (a masked score far above lse) by 0, which is NaN; and use -inf, not a "
                 "finite stand-in such as -1e4, which is larger than scores below -1e4. P = "
                 "exp(S - lse), never exp(S) / exp(lse)")


def _far_tile(rng, kind, Bq=16, Bk=24, D=80):
    """One float32 tile whose scores are far from 0. "above": q and keys 12-23 share a large
    component u, so those keys score ~800; they are masked for rows 0-7 (far above those rows'
    lse) and visible to rows 8-15. "below": every score near -30000 (below any -1e4 stand-in),
    with a causal band as mask."""
    lead, scale = (2, 3), 1 / math.sqrt(D)
    u = np.zeros(D)
    u[0] = 1.0
    q = rng.standard_normal(lead + (Bq, D))
    k, v = (rng.standard_normal(lead + (Bk, D)) for _ in range(2))
    if kind == "above":
        q = q + 85 * u
        k[..., 12:, :] += 85 * u
        mask = np.ones((Bq, Bk), bool)
        mask[:8, 12:] = False
    else:
        q = q - 520 * u
        k = k + 520 * u
        mask = np.arange(Bk)[None, :] <= np.arange(Bq)[:, None] + 4          # (Bq, Bk)
    q, k, v = (t.astype(np.float32).astype(np.float64) for t in (q, k, v))
    s = np.where(mask, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)        # (..., Bq, Bk)
    m = s.max(-1)
    other = m + rng.uniform(-1, 1, m.shape)                 # the row's mass outside this tile
    lse = np.logaddexp(m + np.log(np.exp(s - m[..., None]).sum(-1)), other)   # (..., Bq)
    out, dout = (rng.standard_normal(lead + (Bq, D)) for _ in range(2))
    dk_j, dv_j = (rng.standard_normal(lead + (Bk, D)) for _ in range(2))
    f32 = lambda t: t.astype(np.float32)  # noqa: E731
    return [f32(q), f32(k), f32(v), f32(out), f32(dout), f32(lse), mask, scale, f32(dk_j), f32(dv_j)]


def check_scores_far_from_zero(impl, rng):
    """scores far from 0: masked keys ~800 above lse, and rows whose scores all lie near -30000"""
    for kind, what in (("above", "rows 0-7 have masked keys ~800 above their lse"),
                       ("below", "every score near -30000")):
        args = _far_tile(rng, kind)
        got = _call(impl, args)
        expected = _formulas(*args)
        library, base2 = library_update(*args), _base2_update(*args)
        magnitude = _tile_magnitudes(*args)
        for name, g, e, b1, b2 in zip(NAMES, got, expected, library, base2):
            checks.expect_close(g, e, baseline=(b1, b2), dtype=np.dtype(np.float32),
                                name=f"{name} ({what})", magnitude=magnitude[name],
                                hint=lambda: _diagnose(impl) or HINT_EXPONENT)


def _grads_autograd(q, k, v, dout, causal, *, reference):
    """dq, dk, dv by torch.autograd: of attention_ref in float64 (reference=True) or of
    naive attention in the inputs' dtype (a baseline)."""
    q, k, v = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    if reference:
        out, _ = attention_ref(q, k, v, causal=causal)
    else:
        out = attention_naive(q, k, v, causal=causal)
    out.backward(torch.from_numpy(dout).to(out.dtype))
    return [t.grad.numpy() for t in (q, k, v)]


def _expect_backward(impl, rng, shape_q, shape_k, block_q, block_k, causal):
    q = rng.standard_normal(shape_q).astype(np.float32)
    k, v = (rng.standard_normal(shape_k).astype(np.float32) for _ in range(2))
    dout = rng.standard_normal(shape_q).astype(np.float32)
    out, lse = fa2_forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    fn = checks.function(impl, "dkdv_update")
    got = fa2_backward(q, k, v, out, lse, dout, block_q=block_q, block_k=block_k, causal=causal,
                       dkdv_update=fn)
    expected = _grads_autograd(q, k, v, dout, causal, reference=True)
    library = fa2_backward(q, k, v, out, lse, dout, block_q=block_q, block_k=block_k,
                           causal=causal)
    unfused = fa2_backward(q, k, v, out, lse, dout, block_q=shape_q[-2], block_k=shape_k[-2],
                           causal=causal)                            # one tile: P unfused
    naive = _grads_autograd(q, k, v, dout, causal, reference=False)
    base2 = fa2_backward(q, k, v, out, lse, dout, block_q=block_q, block_k=block_k,
                         causal=causal, dkdv_update=_base2_update)
    what = (f"fa2_backward with your step, float32 q {shape_q}, k and v {shape_k}, "
            f"block_q={block_q}, block_k={block_k}, causal={causal}")
    hint = lambda: _diagnose(impl) or "follow the formulas in the docstring"  # noqa: E731
    magnitude = attention_magnitudes(q, k, v, dout, causal=causal)
    for n, name in enumerate(("dq", "dk", "dv")):
        baseline = (library[n], unfused[n], base2[n], np.nan_to_num(naive[n], nan=0.0))
        checks.expect_close(got[n], expected[n], baseline=baseline, dtype=np.dtype(np.float32),
                            name=f"{name} of {what}", hint=hint, magnitude=magnitude[name])


def check_backward(impl, rng):
    """fa2_backward with your step matches autograd of attention_ref (blocks not dividing N)"""
    block_q, block_k = [(16, 32), (32, 48), (64, 64)][rng.integers(3)]
    _expect_backward(impl, rng, (2, 3, 97, 80), (2, 3, 130, 80), block_q, block_k, causal=False)


def check_backward_causal(impl, rng):
    """causal: Nq > Nk (rows with no key get zero gradient) and Nq < Nk"""
    _expect_backward(impl, rng, (1, 9, 130, 80), (1, 9, 97, 80), 32, 16, causal=True)
    _expect_backward(impl, rng, (1, 9, 17, 80), (1, 9, 130, 80), 16, 48, causal=True)


CHECKS = [check_one_tile, check_empty_rows, check_scores_far_from_zero, check_backward,
          check_backward_causal]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex08(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
