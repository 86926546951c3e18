"""flashlib.teach.tiled: every NumPy algorithm against the float64 oracle, on irregular shapes."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashlib.teach import tiled
from flashlib.reference import attention_naive, attention_ref, causal_mask
from flashlib.testing import assert_close, attention_magnitudes

pytestmark = pytest.mark.filterwarnings("error")   # no RuntimeWarning may reach a learner

SHAPES = [(1, 17), (17, 1), (97, 130), (130, 97), (17, 17), (1, 1)]   # (Nq, Nk)
DTYPES = [np.float32, np.float64]
FORWARDS = {
    "standard": lambda q, k, v, causal, bq, bk: tiled.standard_attention(q, k, v, causal=causal),
    "online": lambda q, k, v, causal, bq, bk: tiled.online_attention(q, k, v, causal=causal),
    "fa1": lambda q, k, v, causal, bq, bk: tiled.fa1_forward(q, k, v, causal=causal,
                                                             block_q=bq, block_k=bk),
    "fa2": lambda q, k, v, causal, bq, bk: tiled.fa2_forward(q, k, v, causal=causal,
                                                             block_q=bq, block_k=bk),
}


def inputs(Nq, Nk, dtype, *, heads=9, D=80, batch=1):
    rng = np.random.default_rng()
    return tuple(rng.standard_normal((batch, heads, n, D)).astype(dtype) for n in (Nq, Nk, Nk))


def allowed_of(Nq, Nk, causal):
    return causal_mask(Nq, Nk) if causal else torch.ones(Nq, Nk, dtype=torch.bool)


def naive(q, k, v, *, causal, scale=None):
    """The naive baseline in the inputs' dtype: torch attention_naive and a torch logsumexp."""
    q, k, v = (torch.from_numpy(t) for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale                                   # (B, H, Nq, Nk)
    lse = torch.logsumexp(s.masked_fill(~allowed_of(q.shape[-2], k.shape[-2], causal), -math.inf), -1)
    return attention_naive(q, k, v, causal=causal, scale=scale).numpy(), lse.numpy()


def extended_attention(q, k, v, *, causal, scale=None):
    """Attention in np.longdouble (80-bit on x86): the oracle for float64 results, which the
    float64 attention_ref is too coarse to judge (both carry a few ulps of their own)."""
    if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        pytest.skip("np.longdouble is no wider than float64 on this machine")
    q, k, v = (t.astype(np.longdouble) for t in (q, k, v))
    allowed = allowed_of(q.shape[-2], k.shape[-2], causal).numpy()
    scale = 1 / np.sqrt(np.longdouble(q.shape[-1])) if scale is None else np.longdouble(scale)
    s = np.where(allowed, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)   # (B, H, Nq, Nk)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    out = (e @ v) / np.where(z > 0, z, 1)
    lse = np.where(z > 0, m + np.log(np.where(z > 0, z, 1)), -np.inf)[..., 0]
    return out, lse


def oracle(q, k, v, *, causal, scale=None):
    if q.dtype == np.float64:
        return extended_attention(q, k, v, causal=causal, scale=scale)
    return attention_ref(q, k, v, causal=causal, scale=scale)


def check_forward(out, lse, q, k, v, *, causal, name, expected=None, baseline=None, scale=None):
    assert out.dtype == lse.dtype == q.dtype, f"{name}: result dtype {out.dtype}/{lse.dtype}"
    if expected is None:
        expected = oracle(q, k, v, causal=causal, scale=scale)
    baseline_out, baseline_lse = naive(q, k, v, causal=causal, scale=scale) if baseline is None else baseline
    mags = attention_magnitudes(q, k, v, causal=causal, scale=scale)
    assert_close(out, expected[0], baseline=baseline_out, name=f"{name} out", magnitude=mags["out"])
    assert_close(lse, expected[1], baseline=baseline_lse, name=f"{name} lse", magnitude=mags["lse"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq, Nk", SHAPES)
def test_forward_matches_reference(Nq, Nk, causal, dtype):
    q, k, v = inputs(Nq, Nk, dtype)
    expected, baseline = oracle(q, k, v, causal=causal), naive(q, k, v, causal=causal)
    for name, forward in FORWARDS.items():
        for block_q, block_k in [(16, 24), (64, 64)]:        # neither divides 17, 97 or 130
            out, lse = forward(q, k, v, causal, block_q, block_k)
            check_forward(out, lse, q, k, v, causal=causal, name=f"{name} {block_q}x{block_k}",
                          expected=expected, baseline=baseline)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_large_logits(causal, dtype):
    """Scores of about +-1e3 (scale 40 at head dim 80): exp overflows unless the max is taken
    out, and each score carries rounding of about 1e3 ulps, which the rule's floor allows for."""
    q, k, v = inputs(33, 40, dtype)
    s = np.abs(q @ np.swapaxes(k, -1, -2) * 40.0)
    assert s.max() > 500                                       # the case is what it says
    for block_q, block_k in [(16, 24), (64, 64)]:
        out, lse = tiled.fa2_forward(q, k, v, causal=causal, scale=40.0, block_q=block_q,
                                     block_k=block_k)
        check_forward(out, lse, q, k, v, causal=causal, scale=40.0, name=f"fa2 {block_q}x{block_k}")


@pytest.mark.parametrize("name", FORWARDS)
def test_rows_with_nothing_to_attend(name):
    q, k, v = inputs(130, 97, np.float32, heads=3)          # bottom-right: rows 0..32 are empty
    out, lse = FORWARDS[name](q, k, v, True, 16, 24)
    assert (out[:, :, :33] == 0).all() and np.isneginf(lse[:, :, :33]).all()
    assert np.isfinite(out).all() and np.isfinite(lse[:, :, 33:]).all()


def test_leading_dims_are_free():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal(s) for s in [(17, 80), (97, 80), (97, 80)])
    out, lse = tiled.fa2_forward(q, k, v, block_q=16, block_k=24)         # no batch, no heads
    ref_out, ref_lse = tiled.standard_attention(q[None, None], k[None, None], v[None, None])
    assert_close(out, ref_out[0, 0], baseline=ref_out[0, 0], name="2-d out")
    assert_close(lse, ref_lse[0, 0], baseline=ref_lse[0, 0], name="2-d lse")
    out3, _ = tiled.fa1_forward(*(np.stack([t] * 3) for t in (q, k, v)), block_q=16, block_k=24)
    assert out3.shape == (3, 17, 80)


def test_tile_update_keeps_empty_rows_empty():
    rng = np.random.default_rng()
    scores = rng.standard_normal((2, 16, 24))
    scores[:, :5] = -np.inf                                  # rows 0-4: all keys masked
    scores[:, 5:, 20:] = -np.inf                             # tail keys past Nk
    v_block = rng.standard_normal((2, 24, 80))
    m, l, acc = np.full((2, 16), -np.inf), np.zeros((2, 16)), np.zeros((2, 16, 80))
    m, l, acc = tiled.fa2_tile_update(scores, v_block, m, l, acc)
    assert np.isneginf(m[:, :5]).all() and (l[:, :5] == 0).all() and (acc[:, :5] == 0).all()
    assert np.isfinite(m[:, 5:]).all() and np.isfinite(acc).all()
    # a second, fully masked block leaves every row's state exactly as it was
    m2, l2, acc2 = tiled.fa2_tile_update(np.full_like(scores, -np.inf), v_block, m, l, acc)
    for before, after in ((m, m2), (l, l2), (acc, acc2)):
        np.testing.assert_array_equal(before, after)
    # and the state is (max, sum of exp(s - max), sum of exp(s - max) v) of what was seen
    expected_m = scores[:, 5:].max(-1)
    p = np.exp(scores[:, 5:] - expected_m[..., None])
    assert_close(l[:, 5:], p.sum(-1), baseline=p.sum(-1), name="l")
    assert_close(acc[:, 5:], p @ v_block, baseline=p @ v_block, name="acc")


@pytest.mark.parametrize("causal", [False, True])
def test_fa2_calls_tile_update_once_per_visited_tile(causal):
    q, k, v = inputs(130, 97, np.float64, heads=2)
    calls = []

    def spy(scores, v_block, m, l, acc):
        calls.append(scores.shape)
        return tiled.fa2_tile_update(scores, v_block, m, l, acc)

    out, lse = tiled.fa2_forward(q, k, v, block_q=32, block_k=24, causal=causal, tile_update=spy)
    schedule = tiled.block_schedule(130, 97, block_q=32, block_k=24, causal=causal)
    assert schedule.shape == (5, 5) and len(calls) == schedule.sum()
    assert all(shape == (1, 2, 32, 24) for shape in calls)   # fixed tile shape, padded tails
    assert (schedule.sum() < schedule.size) if causal else schedule.all()   # causal skips tiles
    check_forward(out, lse, q, k, v, causal=causal, name="fa2 with a spy")


@pytest.mark.parametrize("Nq, Nk", [(1, 17), (17, 1), (97, 130), (130, 97), (33, 33), (5, 64)])
@pytest.mark.parametrize("block_q, block_k", [(1, 1), (16, 24), (32, 8), (64, 64)])
def test_causal_block_range_skips_exactly_the_masked_tiles(Nq, Nk, block_q, block_k):
    for q_start in range(0, Nq, block_q):
        visible = tiled.causal_block_range(q_start, q_start + block_q, Nq, Nk, block_k)
        for kb in range(-(-Nk // block_k)):
            mask = tiled.tile_mask(q_start, kb * block_k, block_q, block_k, Nq, Nk, True)
            assert (kb in visible) == mask.any(), (q_start, kb)


@settings(max_examples=40, deadline=None)
@given(Nq=st.integers(1, 40), Nk=st.integers(1, 40), block_q=st.integers(1, 48),
       block_k=st.integers(1, 48), causal=st.booleans())
def test_fa2_is_independent_of_block_sizes(Nq, Nk, block_q, block_k, causal):
    q, k, v = inputs(Nq, Nk, np.float32, heads=2, D=80)
    out, lse = tiled.fa2_forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    check_forward(out, lse, q, k, v, causal=causal, name=f"fa2 {block_q}x{block_k}")


# ---- backward -------------------------------------------------------------------------------

def autograd_grads(q, k, v, dout, *, causal, scale):
    """dq, dk, dv of attention by torch.autograd in the inputs' dtype. Rows with nothing to
    attend to are left out of the graph (their gradient is 0; softmax of -inf only gives NaN)."""
    Nq, Nk = q.shape[2], k.shape[2]
    allowed = allowed_of(Nq, Nk, causal)
    rows = allowed.any(-1)
    q, k, v = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    s = q[:, :, rows] @ k.transpose(-1, -2) * scale                   # (B, H, rows, Nk)
    out = torch.softmax(s.masked_fill(~allowed[rows], -math.inf), -1) @ v
    out.backward(torch.from_numpy(dout[:, :, rows.numpy()]))
    return [t.grad.numpy() for t in (q, k, v)]


def unfused_grads(q, k, v, out, lse, dout, *, causal, scale):
    """The baseline: FA2 Algorithm 2's equations without tiles, P materialised from the same lse,
    in the inputs' dtype: P = exp(S - lse), dV = P^T dO, dP = dO V^T, dS = P * (dP - D) with
    D = rowsum(dO * O).

    Not autograd in that dtype: recomputing P from a rounded lse and D = rowsum(dO * O) cost a
    few ulps that softmax's own backward does not pay (where a row sees one key, autograd's
    dq is exactly 0); against autograd the "2x" rule would judge the algorithm, not the tiling.
    """
    q, k, v, out, lse, dout = (torch.from_numpy(t) for t in (q, k, v, out, lse, dout))
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(
        ~allowed_of(q.shape[2], k.shape[2], causal), -math.inf)             # (B, H, Nq, Nk)
    p = torch.exp(s - lse.nan_to_num(neginf=0.0)[..., None])              # empty rows: 0
    ds = p * (dout @ v.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True))
    grads = (scale * ds @ k, scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ dout)
    return [g.numpy() for g in grads]


def extended_grads(q, k, v, dout, *, causal, scale):
    """The same gradients from the textbook formulas in np.longdouble (80-bit on x86)."""
    q, k, v, dout = (t.astype(np.longdouble) for t in (q, k, v, dout))
    scale = np.longdouble(scale)
    allowed = allowed_of(q.shape[2], k.shape[2], causal).numpy()
    s = np.where(allowed, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)   # (B, H, Nq, Nk)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    p = e / np.maximum(e.sum(-1, keepdims=True), np.finfo(np.longdouble).tiny)
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    return [scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ dout]


# (Nq, Nk, causal, scale). Exact zeros: with one key (17 x 1, 1 x 1) the exact dQ is 0 and every
# implementation leaves rounding noise of its own (autograd often exactly 0, FA2's D = rowsum(dO O)
# a few ulps); 17 x 1 causal has 16 rows with no key (dQ exactly 0) and one with one key. Large
# logits: scale 40 puts the scores near +-1e3.
BACKWARD_CASES = [(Nq, Nk, causal, None)
                  for Nq, Nk in [(1, 17), (17, 1), (97, 130), (130, 97), (17, 17), (1, 1)]
                  for causal in (False, True)] + [(33, 40, False, 40.0), (40, 33, True, 40.0)]


@pytest.mark.parametrize("Nq, Nk, causal, scale", BACKWARD_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_matches_autograd(dtype, Nq, Nk, causal, scale):
    rng = np.random.default_rng()
    q, k, v, dout = (rng.standard_normal((1, 9, n, 80)) for n in (Nq, Nk, Nk, Nq))
    scale = 1 / math.sqrt(80) if scale is None else scale
    if dtype == np.float32:   # oracle: float64 autograd
        expected = autograd_grads(q, k, v, dout, causal=causal, scale=scale)
    else:                     # a float64 result needs an oracle finer than float64
        if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
            pytest.skip("np.longdouble is no wider than float64 on this machine")
        expected = extended_grads(q, k, v, dout, causal=causal, scale=scale)
    q, k, v, dout = (t.astype(dtype) for t in (q, k, v, dout))
    mags = attention_magnitudes(q, k, v, dout, causal=causal, scale=scale)
    for block_q, block_k in [(16, 24), (64, 64)]:
        out, lse = tiled.fa2_forward(q, k, v, causal=causal, scale=scale, block_q=block_q,
                                     block_k=block_k)
        grads = tiled.fa2_backward(q, k, v, out, lse, dout, causal=causal, scale=scale,
                                   block_q=block_q, block_k=block_k)
        baseline = unfused_grads(q, k, v, out, lse, dout, causal=causal, scale=scale)
        for name, actual, exp, base in zip(("dq", "dk", "dv"), grads, expected, baseline):
            assert actual.dtype == dtype
            assert_close(actual, exp, baseline=base, dtype=dtype, magnitude=mags[name],
                         name=f"{name} {block_q}x{block_k}")
        if Nq > Nk and causal:                                # empty rows get no gradient
            assert (grads[0][:, :, :Nq - Nk] == 0).all()


def test_backward_of_a_row_with_nothing_to_attend_is_zero():
    q, k, v = inputs(130, 97, np.float32, heads=2)
    dout = np.random.default_rng().standard_normal(q.shape).astype(np.float32)
    out, lse = tiled.fa2_forward(q, k, v, causal=True)
    dq, dk, dv = tiled.fa2_backward(q, k, v, out, lse, dout, causal=True)
    assert (dq[:, :, :33] == 0).all() and np.isfinite(dq).all()
    # the empty rows' dout must not leak into dk, dv: changing it changes nothing
    dout[:, :, :33] = 1e3
    _, dk_again, dv_again = tiled.fa2_backward(q, k, v, out, lse, dout, causal=True)
    np.testing.assert_array_equal(dk, dk_again)
    np.testing.assert_array_equal(dv, dv_again)


@pytest.mark.parametrize("call, match, error", [
    (lambda: tiled.fa2_forward(np.ones((2, 17, 80)), np.ones((3, 97, 80)), np.ones((3, 97, 80))),
     "must match q", ValueError),
    (lambda: tiled.fa1_forward(np.ones((17, 80)), np.ones((97, 80)), np.ones((96, 80))),
     "k and v must have the same shape", ValueError),
    (lambda: tiled.online_attention(np.ones(80), np.ones((97, 80)), np.ones((97, 80))),
     "q must have shape", ValueError),
    (lambda: tiled.standard_attention(np.ones((17, 80)), np.ones((97, 80), dtype=int),
                                      np.ones((97, 80))), "k must be a float array", TypeError),
    (lambda: tiled.fa2_backward(*(np.ones((n, 80)) for n in (17, 97, 97, 17)), np.ones(16),
                                np.ones((17, 80))), "lse", ValueError),
])
def test_bad_inputs_name_the_argument(call, match, error):
    with pytest.raises(error, match=match):
        call()


def test_merge_states_of_two_key_parts_is_attention_over_both():
    """tiled.merge_states (lesson 03): attention over keys [0, c) merged with [c, Nk) equals
    attention over all of them, for an empty part too; lse in the thousands stays finite; a row
    empty in both parts gives out 0 and lse -inf without NaN."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 3, n, 16)) for n in (7, 11, 11))
    want, want_lse = attention_ref(q, k, v)
    for cut in (0, 1, 6, 11):
        a = attention_ref(q, k[:, :, :cut], v[:, :, :cut])
        b = attention_ref(q, k[:, :, cut:], v[:, :, cut:])
        out, lse = tiled.merge_states(a[0], a[1], b[0], b[1])
        np.testing.assert_allclose(out, want, atol=1e-12)
        np.testing.assert_allclose(lse, want_lse, atol=1e-12)
    big = np.array([3000.0, -3000.0, -np.inf])
    out, lse = tiled.merge_states(np.ones((3, 2)), big, 2 * np.ones((3, 2)), big + np.log(3))
    np.testing.assert_allclose(out[:2], 1.75, rtol=1e-12)                  # weights 1 : 3
    np.testing.assert_allclose(lse[:2], big[:2] + np.log(4), rtol=1e-12)
    assert lse[2] == -np.inf and not out[2].any() and not np.isnan(out).any()
