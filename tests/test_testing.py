"""flashlib.testing's tolerance rule: it admits every correct implementation whatever the BLAS,
its kernels for this CPU or its thread count, and it still rejects real errors.

Run it (with tests/test_tiled.py) under several BLAS settings, as CI's machine may differ from
yours: OPENBLAS_NUM_THREADS=2, OPENBLAS_CORETYPE=Haswell or SkylakeX (tests/conftest.py keeps a
value given from outside and names the settings in the report's header).
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashlib.teach import tiled
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import (FACTOR, ULPS, accumulation_eps, assert_close, attention_magnitudes,
                              error_floor, tolerance)


def draw(rng, Nq, Nk, *, heads=3, D=80, dtype=np.float32):
    return tuple(rng.standard_normal((1, heads, n, D)).astype(dtype) for n in (Nq, Nk, Nk, Nq))


def exact(q, k, v, dout, *, causal=False, scale=None):
    """(out, lse, dq, dk, dv) in float64 by autograd through the oracle."""
    leaves = [torch.tensor(t, dtype=torch.float64, requires_grad=True) for t in (q, k, v)]
    out, lse = attention_ref(*leaves, causal=causal, scale=scale)
    grads = torch.autograd.grad(out, leaves, torch.tensor(dout, dtype=torch.float64))
    return [t.detach().numpy() for t in (out, lse, *grads)]


def naive_grads(q, k, v, dout, *, causal=False, scale=None):
    """dq, dk, dv by autograd through attention_naive, in the inputs' dtype."""
    leaves = [torch.tensor(t, requires_grad=True) for t in (q, k, v)]
    out = attention_naive(*leaves, causal=causal, scale=scale)
    return [g.numpy() for g in torch.autograd.grad(out, leaves, torch.from_numpy(dout))]


def tiled_all(q, k, v, dout, *, causal=False, scale=None, block_q=16, block_k=24):
    out, lse = tiled.fa2_forward(q, k, v, causal=causal, scale=scale, block_q=block_q, block_k=block_k)
    grads = tiled.fa2_backward(q, k, v, out, lse, dout, causal=causal, scale=scale,
                               block_q=block_q, block_k=block_k)
    return [out, lse, *grads]


NAMES = ("out", "lse", "dq", "dk", "dv")


@settings(max_examples=25, deadline=None)
@given(Nq=st.integers(1, 40), Nk=st.integers(1, 40), causal=st.booleans(),
       scale=st.sampled_from([None, 2.0, 40.0]), dtype=st.sampled_from([np.float32, np.float64]),
       blocks=st.sampled_from([(16, 24), (64, 64), (1, 7)]), seed=st.integers(0, 2**32 - 1))
def test_the_floor_alone_admits_a_correct_implementation(Nq, Nk, causal, scale, dtype, blocks, seed):
    """With no baseline's help (a baseline that happens to be exact), FA2's tiled forward and
    backward pass: the floor computed from the inputs covers its rounding, including one key
    (exact dQ 0), rows with no key and scores near +-1e3. The old rule (2x the baseline, else
    4 ulps of the result) failed here: its floor did not grow with the terms that cancel."""
    q, k, v, dout = draw(np.random.default_rng(seed), Nq, Nk, dtype=dtype)
    results = tiled_all(q, k, v, dout, causal=causal, scale=scale, block_q=blocks[0], block_k=blocks[1])
    expected = exact(q, k, v, dout, causal=causal, scale=scale)
    mags = attention_magnitudes(q, k, v, dout, causal=causal, scale=scale)
    for name, got, want in zip(NAMES, results, expected):
        if dtype == np.float64 and name != "lse":
            continue  # float64 results need an oracle finer than float64: tests/test_tiled.py
        assert_close(got, want, baseline=want, dtype=dtype, magnitude=mags[name], name=name)


@pytest.mark.parametrize("Nq, Nk, causal", [(17, 1, False), (1, 1, False), (17, 1, True)])
def test_one_key_any_correct_baseline_gives_the_same_verdict(Nq, Nk, causal):
    """One key: the exact dQ is 0 and float32 autograd often gets exactly 0, FA2's D = rowsum(dO O)
    a few ulps of |dO||v|. Each correct implementation passes whichever of them is the baseline."""
    q, k, v, dout = draw(np.random.default_rng(), Nq, Nk, heads=9)
    expected = exact(q, k, v, dout, causal=causal)[2:]
    mags = attention_magnitudes(q, k, v, dout, causal=causal)
    impls = {"autograd": naive_grads(q, k, v, dout, causal=causal),
             "tiled 16x24": tiled_all(q, k, v, dout, causal=causal)[2:],
             "tiled 1x1": tiled_all(q, k, v, dout, causal=causal, block_q=1, block_k=1)[2:]}
    for i, name in enumerate(("dq", "dk", "dv")):
        for judged, grads in impls.items():
            for base, base_grads in impls.items():
                assert_close(grads[i], expected[i], baseline=base_grads[i], dtype=np.float32,
                             magnitude=mags[name], name=f"{name} of {judged}, baseline {base}")
    if causal:   # rows 0-15 see no key: their dQ is exactly 0, not a few ulps
        assert all((g[0][:, :, :Nq - 1] == 0).all() for g in impls.values())


@pytest.mark.parametrize("Nq, Nk, causal, dtype", [
    (97, 130, False, np.float32), (130, 97, True, np.float32), (17, 1, False, np.float32),
    (1000, 1500, False, np.float32),   # the H100 flake's size: sums of |terms| grow with N
    (97, 130, False, np.float64), (17, 1, False, np.float64)])
def test_a_gradient_off_by_1e3_relative_fails(Nq, Nk, causal, dtype):
    """The floor is far below real mistakes: each of out, dq, dk, dv scaled by 1 + 1e-3, or with
    noise of 1e-3 of the gradients' size added, is rejected (the correct result passes). With one
    key dQ = dK = 0 and only the noise is judged (1e-3 of |dV|, the gradients' size there)."""
    rng = np.random.default_rng()
    q, k, v, dout = draw(rng, Nq, Nk, dtype=dtype)
    expected = exact(q, k, v, dout, causal=causal)
    results = tiled_all(q, k, v, dout, causal=causal, block_q=64, block_k=64)
    baselines = [tiled.standard_attention(q, k, v, causal=causal)[0], None,
                 *naive_grads(q, k, v, dout, causal=causal)]
    mags = attention_magnitudes(q, k, v, dout, causal=causal)
    size = max(float(np.abs(e).max()) for e in expected[2:])          # a gradient's scale
    for name, got, want, base in zip(NAMES, results, expected, baselines):
        if name == "lse":
            continue
        close = lambda x: assert_close(x, want, baseline=base, dtype=dtype,  # noqa: E731
                                       magnitude=mags[name], name=name)
        if dtype == np.float32:   # float64 results need a finer oracle (tests/test_tiled.py)
            close(got)
        wrong = [want + 1e-3 * size * rng.choice([-1.0, 1.0], want.shape)]
        if np.abs(want).max() > 0.1 * size:
            wrong.append(want * (1 + 1e-3))
        for bad in wrong:
            with pytest.raises(AssertionError, match=f"{name}: max error"):
                close(bad.astype(dtype))


def test_floor_follows_the_magnitude_and_the_accumulation_precision():
    zeros = np.zeros(7)
    eps32, eps64 = float(np.finfo(np.float32).eps), float(np.finfo(np.float64).eps)
    # no magnitude: ULPS ulps of the dtype at the result's scale (at least 1), as before
    assert error_floor(np.float32, zeros) == ULPS * eps32
    assert error_floor(np.float32, np.full(3, -50.0)) == ULPS * eps32 * 50
    # a magnitude: ULPS ulps of the accumulation precision times it, from the inputs alone
    assert tolerance(zeros, zeros, np.float32, magnitude=1e3) == FACTOR * ULPS * eps32 * 1e3
    assert tolerance(zeros, zeros, np.float64, magnitude=1e3) == FACTOR * ULPS * eps64 * 1e3
    # float16/bfloat16 kernels accumulate in float32: the term uses float32's ulp, so their
    # bar stays the baseline's or the float16 result's rounding
    assert accumulation_eps(torch.float16) == accumulation_eps(torch.bfloat16) == eps32
    assert error_floor(torch.float16, zeros, 1e3) == ULPS * float(torch.finfo(torch.float16).eps)
    # the baseline's error still counts when it is larger
    assert tolerance(zeros, np.full(7, 1e-2), np.float32, magnitude=1.0) == FACTOR * 1e-2
    with pytest.raises(ValueError, match="magnitude"):
        tolerance(zeros, zeros, np.float32, magnitude=-1.0)
    # an approximation made on purpose counts with its bound, and only where it is larger
    assert tolerance(zeros, zeros, np.float32, method_error=1e-3) == FACTOR * 1e-3
    assert tolerance(zeros, np.full(7, 1e-2), np.float32, method_error=1e-3) == FACTOR * 1e-2


def test_the_lse_allows_for_the_gpus_tanh_only_where_a_kernel_takes_it():
    # bfloat16 softcaps on a GPU take tanh.approx.f32 (kernels/score_mod.py); nothing else does
    from flashlib import runtime
    assert not runtime.approximate_tanh(torch.float16, "cuda")
    assert not runtime.approximate_tanh(torch.bfloat16, "cpu")
    assert runtime.TANH_APPROX_ERROR < float(torch.finfo(torch.bfloat16).eps) / 4


def test_magnitudes_of_rows_with_nothing_to_attend_are_zero():
    """All keys masked: out 0 and lse -inf exactly, so nothing is rounded and the floor is the
    dtype's alone: an out of 1e-5 where 0 is exact fails."""
    q, k, v, dout = draw(np.random.default_rng(), 5, 9)
    nothing = np.zeros((5, 9), dtype=bool)
    mags = attention_magnitudes(q, k, v, dout, mask=nothing)
    assert mags == dict(out=0.0, lse=0.0, dq=0.0, dk=0.0, dv=0.0)
    out, _ = attention_ref(q, k, v, mask=nothing)
    assert (out == 0).all()
    with pytest.raises(AssertionError, match="out: max error 1e-05"):
        assert_close(np.full_like(out, 1e-5), out, baseline=out, dtype=np.float32,
                     magnitude=mags["out"], name="out")


def test_magnitudes_take_grouped_heads_and_numpy_or_torch():
    rng = np.random.default_rng()
    q, dout = (rng.standard_normal((2, 6, 17, 80)) for _ in range(2))
    k, v = (rng.standard_normal((2, 2, 33, 80)) for _ in range(2))
    a = attention_magnitudes(q, k, v, dout, causal=True)
    b = attention_magnitudes(*(torch.from_numpy(t).float() for t in (q, k, v, dout)), causal=True)
    assert a.keys() == b.keys() == set(NAMES)
    for name in NAMES:
        assert a[name] > 0 and math.isclose(a[name], b[name], rel_tol=1e-5), name
    # grouped heads: key head 0 serves query heads 0-2, so its dK terms add up over the group
    solo = attention_magnitudes(q[:, :1], k[:, :1], v[:, :1], dout[:, :1], causal=True)
    assert a["dk"] >= solo["dk"]
    with pytest.raises(ValueError, match="heads_q=6 is not a multiple of heads_kv=4"):
        attention_magnitudes(q, np.ones((2, 4, 33, 80)), np.ones((2, 4, 33, 80)))
