"""flash_attention (FA2 forward + backward kernels) against the float64 oracle.

CPU: through Triton's interpreter at small, irregular shapes. GPU (marked ``gpu``): real sizes,
N up to 16k, head dims 64/80/128/256, float16 and bfloat16, causal and not, grouped heads.
"""
import pytest
import torch

from flashlib import runtime
from flashlib.teach import tiled
from flashlib.ops import block_sparse_attention, flash_attention
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import assert_attention_close, assert_close, attention_magnitudes

gpu = pytest.mark.skipif(runtime.DEVICE.type != "cuda", reason="needs a CUDA GPU")
DEV = runtime.DEVICE


def rand(*shape, dtype, seed=None):
    return torch.randn(*shape, dtype=dtype, device=DEV)


def run_and_check(B, Hq, Hkv, Nq, Nk, D, causal, dtype, *, backward=True, scale=None, inputs=None,
                  **score_mods):
    """flash_attention's out, lse and (backward) gradients against the oracle. inputs: (q, k, v)
    instead of random ones; score_mods: ``softcap``, ``alibi_slopes``."""
    q, k, v = inputs or (rand(B, Hq, Nq, D, dtype=dtype), rand(B, Hkv, Nk, D, dtype=dtype),
                         rand(B, Hkv, Nk, D, dtype=dtype))
    dout = rand(B, Hq, Nq, D, dtype=dtype)
    leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
    out, lse = flash_attention(*leaves, causal=causal, scale=scale, return_lse=True, **score_mods)
    ref_leaves = [t.double().requires_grad_(backward) for t in (q, k, v)]
    ref, ref_lse = attention_ref(*ref_leaves, causal=causal, scale=scale, **score_mods)
    base_leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
    base = attention_naive(*base_leaves, causal=causal, scale=scale, **score_mods)
    assert lse.dtype == torch.float32
    assert_attention_close(out.detach(), lse, q, k, v, causal=causal, scale=scale,
                           reference=(ref.detach(), ref_lse.detach()), **score_mods)
    if backward:
        grads = torch.autograd.grad(out, leaves, dout)
        ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double())
        base_grads = torch.autograd.grad(base, base_leaves, dout)
        if dtype == torch.float32 and not score_mods:  # a second baseline: tiled, in NumPy
            base_grads = list(zip(base_grads, tiled_backward(q, k, v, out, lse, dout, causal, scale)))
        mags = attention_magnitudes(q, k, v, dout, causal=causal, scale=scale, **score_mods)
        for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
            assert g.shape == r.shape and g.dtype == dtype
            assert_close(g, r, baseline=b, dtype=dtype, name=name, magnitude=mags[name])


def skip_without_hopper(dtype):
    """Skip without an sm90 GPU and Triton 3.6 (the FA3 kernels) for ``dtype``."""
    from flashlib.kernels import fa3_fwd
    probe = torch.empty(1, 1, 64, 64, dtype=dtype, device=DEV)
    if not fa3_fwd.supported(probe, probe, probe):
        pytest.skip("needs an sm90 GPU with Triton 3.6 (FA3 kernels)")


@pytest.fixture
def hopper_kernels():
    """Every problem to the FA3 kernels where they run: no size threshold, a score modifier at
    both head dims (the options in force for the test)."""
    with runtime.kernel_options(fa3=True, fa3_from_flops=0, fa3_fwd_mod_head_dims=(64, 128)):
        yield


def spy_on_version(monkeypatch, number, record, backward=False):
    """Version ``number``'s forward (or backward) in the dispatcher's registry, wrapped to call
    ``record(args, kwargs)`` first (or instead, when record returns something: then that)."""
    from flashlib.kernels import dispatch
    version = dispatch.VERSIONS[number]
    real = version.backward if backward else version.forward

    def spy(*args, **kwargs):
        result = record(args, kwargs)
        return real(*args, **kwargs) if result is None else result
    monkeypatch.setitem(dispatch.VERSIONS, number, version._replace(**{"backward" if backward else "forward": spy}))


def tiled_backward(q, k, v, out, lse, dout, causal, scale):
    """flashlib.teach.tiled.fa2_backward (NumPy, no grouped heads) on grouped-head inputs."""
    group = q.shape[1] // k.shape[1]
    arrays = [t.detach().cpu().numpy() for t in (q, k.repeat_interleave(group, 1),
                                                 v.repeat_interleave(group, 1), out, lse, dout)]
    dq, dk, dv = tiled.fa2_backward(*arrays, causal=causal, scale=scale)
    fold = lambda g: g.reshape(k.shape[0], k.shape[1], group, *g.shape[2:]).sum(2)  # noqa: E731
    return dq, fold(dk), fold(dv)


CPU_CASES = [  # (B, Hq, Hkv, Nq, Nk, D, causal)
    (1, 2, 2, 128, 128, 64, False),
    (2, 9, 3, 17, 97, 80, True),     # grouped heads, Nq < Nk, head dim 80
    (1, 2, 1, 130, 33, 80, True),    # Nq > Nk causal: the first 97 rows attend to nothing
    (1, 1, 1, 1, 130, 16, False),
    (1, 3, 3, 97, 97, 40, True),
    (2, 4, 2, 65, 1, 96, False),     # one key: the exact dQ is 0
    (1, 2, 1, 1, 1, 80, True),       # one query, one key: dQ = dK = 0 exactly
]


@pytest.mark.parametrize("case", CPU_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference(case, dtype):
    run_and_check(*case, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_large_logits(causal):
    """Scores near +-1e3 (scale 40): each carries about 1e3 ulps of rounding, in the kernel
    as in any float32 implementation; the tolerance's floor grows with them."""
    run_and_check(1, 3, 1, 40, 33, 80, causal, torch.float32, scale=40.0)


def test_bfloat16_and_custom_scale():
    run_and_check(1, 2, 1, 70, 45, 32, True, torch.bfloat16, scale=0.3)


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_scales_at_or_below_zero(scale):
    """A negative scale reverses the scores' order and a zero one makes every visible score 0
    (a kernel that took the max before scaling, or multiplied the scale into masked -inf keys,
    would fail here: FA3's forward folds only scales > 0, fa3_fwd._fold). Causal with Nq > Nk:
    rows with no key, and masked keys in every row's last block."""
    run_and_check(1, 2, 1, 70, 45, 32, True, torch.float32, scale=scale)


def test_non_contiguous_inputs():
    # (B, N, H, D) storage viewed as (B, H, N, D), as produced by a fused qkv projection
    q = rand(2, 33, 4, 64, dtype=torch.float32).transpose(1, 2)
    k = rand(2, 50, 2, 64, dtype=torch.float32).transpose(1, 2)
    v = rand(2, 50, 2, 64, dtype=torch.float32).transpose(1, 2)
    out, lse = flash_attention(q, k, v, return_lse=True)
    assert_attention_close(out, lse, q, k, v)   # 2x naive's error alone failed 1 seed in 2000


def test_empty_rows_are_zero_not_nan():
    q, k, v = (rand(1, 1, n, 16, dtype=torch.float32) for n in (9, 4, 4))
    q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[0, 0, :5] == 0) and torch.all(lse[0, 0, :5] == float("-inf"))
    assert torch.isfinite(lse[0, 0, 5:]).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


class DropFirstGrad(torch.autograd.Function):
    """x + y, whose backward gives x no gradient (None): autograd then hands None upstream."""
    @staticmethod
    def forward(ctx, x, y):
        return x + y

    @staticmethod
    def backward(ctx, grad):
        return None, grad


@pytest.mark.parametrize("attend", ["dense", "block_sparse"])
def test_undefined_output_gradient_gives_no_input_gradient(attend):
    # the autograd nodes do not materialise zero gradients, so they must accept None
    q, k, v, y = (rand(1, 2, 20, 16, dtype=torch.float32).requires_grad_() for _ in range(4))
    if attend == "dense":
        out = flash_attention(q, k, v, causal=True)
    else:
        out = block_sparse_attention(q, k, v, torch.ones(1, 1, dtype=torch.bool, device=DEV), block_size=32)
    DropFirstGrad.apply(out, y).sum().backward()
    assert q.grad is None and k.grad is None and v.grad is None
    assert torch.equal(y.grad, torch.ones_like(y))


@pytest.mark.parametrize("bad, match", [
    (dict(q=torch.randn(2, 8, 16)), "q must have 4 dims"),
    (dict(k=torch.randn(1, 3, 8, 16)), "k and v must have the same shape"),
    (dict(k=torch.randn(1, 3, 8, 16), v=torch.randn(1, 3, 8, 16)), "heads_q=4 is not a multiple of heads_kv=3"),
    (dict(q=torch.randn(1, 4, 8, 16).double()), "q has dtype torch.float64"),
    (dict(v=torch.randn(1, 2, 8, 16).half()), "v has dtype torch.float16 but q has torch.float32"),
    (dict(q=torch.randn(1, 4, 8, 300), k=torch.randn(1, 2, 8, 300), v=torch.randn(1, 2, 8, 300)), "headdim 300"),
    (dict(q=[[1.0]]), "q must be a torch.Tensor"),
    (dict(causal="yes"), "causal must be True or False"),
    (dict(scale=float("nan")), "scale must be a finite real number"),
])
def test_bad_input_names_the_argument(bad, match):
    args = dict(q=torch.randn(1, 4, 8, 16), k=torch.randn(1, 2, 8, 16), v=torch.randn(1, 2, 8, 16))
    args = {name: t.to(DEV) if isinstance(t, torch.Tensor) else t for name, t in args.items()}
    opts = {n: bad.pop(n) for n in ("causal", "scale") if n in bad}
    args.update({n: t.to(DEV) if isinstance(t, torch.Tensor) else t for n, t in bad.items()})
    with pytest.raises((ValueError, TypeError), match=match):
        flash_attention(args["q"], args["k"], args["v"], **opts)


def test_checks_kept_for_a_call_that_passed_never_pass_another(monkeypatch):
    # check_inputs keeps the verdict of a call that passed (inputs._passed): whatever its key
    # leaves out must not let a bad call through after a good one
    from flashlib.inputs import check_inputs
    q, k, v = (torch.randn(1, 4, 8, 16, device=DEV) for _ in range(3))
    assert check_inputs(q, k, v, causal=True) == 0.25
    assert check_inputs(q, k, v, causal=True, scale=0.5) == 0.5
    import numpy as np
    assert check_inputs(q, k, v, causal=True, scale=np.float64(0.5)) == 0.5
    for bad, match in [(dict(causal=1), "causal must be True or False"),
                       (dict(causal=True, scale=float("inf")), "scale must be a finite real number"),
                       (dict(causal=True, scale=[0.5]), "scale must be a finite real number"),
                       (dict(causal=True, v=v.double()), "v has dtype torch.float64"),
                       (dict(causal=True, k=k.half()), "k has dtype torch.float16 but q has"),
                       (dict(causal=True, k=k[:, :3], v=v[:, :3]), "heads_q=4 is not a multiple of heads_kv=3"),
                       (dict(causal=True, q=q.cpu().numpy()), "q must be a torch.Tensor")]:
        args = dict(q=q, k=k, v=v) | bad
        with pytest.raises((TypeError, ValueError), match=match):
            check_inputs(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    if runtime.DEVICE.type == "cpu":
        monkeypatch.setattr(runtime, "INTERPRET", False)   # a CPU tensor without the interpreter
        with pytest.raises(ValueError, match="q is on cpu"):
            check_inputs(q, k, v, causal=True)


def test_fa2_plans_replay_only_calls_with_the_same_key(monkeypatch):
    # where launches may be direct (a GPU), fa2_forward / fa2_backward replay the launches of an
    # earlier call with the same plan key: anything the launches depend on must make a new plan
    from flashlib.kernels import fa2_bwd, fa2_fwd, launch, score_mod
    monkeypatch.setattr(launch, "SUPPORTED", True)   # a fact of the GPU machines, not a switch
    first, replays = [], []

    def recording_fast_launch(kernel, grid, *args, kernel_options=None, **kwargs):
        first.append(kernel)
        return lambda *tensors: replays.append(tensors)

    for module in (fa2_fwd, fa2_bwd):
        monkeypatch.setattr(module, "fast_launch", recording_fast_launch)
        monkeypatch.setattr(module, "_plans", {})
    q, k, v, dout = (torch.randn(1, 4, 32, 16, dtype=torch.float16) for _ in range(4))
    out, lse = torch.randn_like(q), torch.randn(1, 4, 32)

    def counts(launcher, *tensors, **change):
        launcher(*tensors, **({"causal": True, "scale": 0.25} | change))
        return len(first), len(replays)

    others = [dict(causal=False), dict(scale=0.5), dict(options=runtime.OPTIONS.replace(fa3_fold_scale=False)),
              dict(score_mod=score_mod.make(q, score_mod.Modifiers(softcap=5.0)))]
    assert counts(fa2_fwd.fa2_forward, q, k, v) == (1, 0)
    q2 = torch.randn_like(q)
    assert counts(fa2_fwd.fa2_forward, q2, k, v) == (1, 1) and replays[-1][0] is q2
    strided = torch.randn(1, 32, 4, 16, dtype=torch.float16).transpose(1, 2)
    for n, (tensors, change) in enumerate([((q.float(), k.float(), v.float()), {}), ((strided, k, v), {}),
                                           *(((q, k, v), c) for c in others)], start=2):
        assert counts(fa2_fwd.fa2_forward, *tensors, **change) == (n, 1), change
    first.clear(), replays.clear()
    assert counts(fa2_bwd.fa2_backward, q, k, v, out, lse, dout) == (2, 0)          # dQ, then dK/dV
    assert counts(fa2_bwd.fa2_backward, q2, k, v, out, lse, dout) == (2, 2) and replays[-2][0] is q2
    for n, (tensors, change) in enumerate([((q, k, v, out, lse, dout.float()), {}),  # no plan: plain
                                           ((q, k, v, out, lse, strided), {}),
                                           *(((q, k, v, out, lse, dout), c) for c in others)], start=2):
        assert counts(fa2_bwd.fa2_backward, *tensors, **change) == (2 * n, 2), change


@pytest.mark.skipif(runtime.DEVICE.type == "cuda", reason="CPU-only check")
def test_cuda_tensor_without_gpu_or_cpu_tensor_without_interpreter(monkeypatch):
    monkeypatch.setattr(runtime, "INTERPRET", False)
    x = torch.randn(1, 1, 4, 16)
    with pytest.raises(ValueError, match="q is on cpu"):
        flash_attention(x, x, x)


GPU_CASES = [  # (B, Hq, Hkv, Nq, Nk, D, causal): real sizes, ragged lengths, grouped heads
    (1, 2, 2, 16384, 16384, 128, True),
    (1, 2, 2, 16384, 16384, 64, False),
    (2, 4, 1, 4096, 4096, 128, True),
    (1, 4, 2, 4000, 8195, 80, True),
    (2, 3, 3, 1023, 2049, 256, False),
    (1, 8, 2, 3001, 3001, 256, True),
    (4, 6, 3, 777, 129, 96, True),
    (1, 2, 2, 1, 16384, 64, False),
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_real_sizes(case, dtype):
    run_and_check(*case, dtype)


def test_hopper_forward_folds_only_positive_factors():
    """FA3's forward multiplies a factor of the scores into exp2's FFMA (its max taken on the raw
    scores, max(s c) = c max(s)) only where c > 0 is known: the scale of plain scores when it is
    positive (a negative one would need the min, a zero one make masked keys -inf * 0 = NaN) and
    a softcap's cap (validated > 0); never ALiBi's bias, added per score; none with the
    fa3_fold_scale option off (the launcher passes FOLD=0 then)."""
    from flashlib.kernels import fa3_fwd, score_mod
    assert fa3_fwd._fold(score_mod.identity, 0.125) == 1
    assert fa3_fwd._fold(score_mod.identity, -0.125) == 0 and fa3_fwd._fold(score_mod.identity, 0.0) == 0
    assert (fa3_fwd._fold(score_mod.tanh_softcap, -1.0), fa3_fwd._fold(score_mod.tanh_softcap_approx, 1.0)) == (2, 3)
    for fn in (score_mod.alibi_bias, score_mod.tanh_softcap_alibi_bias, score_mod.tanh_softcap_approx_alibi_bias):
        assert fa3_fwd._fold(fn, 0.125) == 0
    assert runtime.KernelOptions().fa3_fold_scale and not runtime.KernelOptions(fa3_fold_scale=False).fa3_fold_scale


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("scale", [0.3, -0.2, 0.0])
def test_gpu_hopper_forward_at_any_scale(hopper_kernels, scale):
    """FA3's forward folds a scale > 0 into exp2's FFMA (max(s c) = c max(s): the fa3_fold_scale
    option) and scales first otherwise; both match the oracle with masked keys (causal, ragged)
    present, where a folded 0 would give -inf * 0 = NaN."""
    skip_without_hopper(torch.float16)
    for D in (64, 128):
        run_and_check(2, 4, 2, 333, 517, D, True, torch.float16, scale=scale)
        run_and_check(1, 2, 2, 300, 130, D, True, torch.float16, scale=scale)   # rows with no key


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_float32_is_exact(causal):
    run_and_check(2, 4, 2, 1000, 1500, 64, causal, torch.float32)


@gpu
@pytest.mark.gpu
def test_gpu_planned_launches_replay_the_plain_ones():
    """kernels/launch.py: a second call with the same key replays the first call's launches; its
    results are bit-equal to plain ``kernel[grid](...)`` launches. A view at another alignment,
    another layout and another shape each get a plan of their own."""
    from flashlib.kernels import fa2_bwd, fa2_fwd, launch
    if not launch.enabled(runtime.OPTIONS):
        pytest.skip(f"direct launches are off for Triton {__import__('triton').__version__}")

    def forward_backward(q, k, v, dout):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out, lse = flash_attention(*leaves, causal=True, return_lse=True)
        return (out, lse, *torch.autograd.grad(out, leaves, dout))

    big = rand(3, 6, 515, 64, dtype=torch.float16)
    base = big.flatten()[:2 * 6 * 515 * 64].view(2, 6, 515, 64)
    shifted = big.flatten()[4:4 + 2 * 6 * 515 * 64].view(2, 6, 515, 64)   # 8 bytes off 16-byte alignment
    transposed = rand(2, 515, 6, 64, dtype=torch.float16).transpose(1, 2)
    k, v = rand(2, 2, 700, 64, dtype=torch.float16), rand(2, 2, 700, 64, dtype=torch.float16)
    sliced = base[:, :, :300]            # not dense: its out is contiguous
    for q, out_strides in ((base, base.stride()), (shifted, base.stride()),
                           (transposed, transposed.stride()), (sliced, sliced.contiguous().stride())):
        dout = rand(*q.shape, dtype=torch.float16)
        first = forward_backward(q, k, v, dout)          # records the plans
        plans = len(fa2_fwd._plans), len(fa2_bwd._plans)
        replayed = forward_backward(q, k, v, dout)
        assert (len(fa2_fwd._plans), len(fa2_bwd._plans)) == plans   # a hit, not a new plan
        with runtime.kernel_options(fast_launch=False):
            plain = forward_backward(q, k, v, dout)
        for a, b, c in zip(first, replayed, plain):
            assert torch.equal(a, b) and torch.equal(b, c)
        assert replayed[0].stride() == out_strides                    # out in q's layout
        assert_attention_close(replayed[0], replayed[1], q, k, v, causal=True)
    assert len(fa2_fwd._plans) >= 4


@gpu
@pytest.mark.gpu
def test_gpu_hopper_planned_launches_replay_the_plain_ones(hopper_kernels):
    """The FA3 kernels' plans (kernels/launch.py with TMA descriptors rebuilt around new tensors):
    a second call replays the first's launches, bit-equal to Triton's plain launches, for a dense,
    a transposed and a grouped-head causal problem; fresh inputs of the same layout give the
    oracle's answer (the descriptors point at the new tensors, not the recorded ones)."""
    from flashlib.kernels import fa3_bwd, fa3_fwd, launch
    probe = rand(1, 1, 64, 64, dtype=torch.float16)
    if not (launch.enabled(runtime.OPTIONS) and DEV.type == "cuda" and fa3_fwd.supported(probe, probe, probe)):
        pytest.skip("needs an sm90 GPU with Triton 3.6 (FA3 kernels, direct launches)")

    def forward_backward(q, k, v, dout):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out, lse = flash_attention(*leaves, causal=True, return_lse=True)
        return (out, lse, *torch.autograd.grad(out, leaves, dout))

    half = dict(dtype=torch.float16)
    for q, k, v in ((rand(2, 4, 333, 64, **half), rand(2, 4, 300, 64, **half), rand(2, 4, 300, 64, **half)),
                    (rand(2, 333, 4, 128, **half).transpose(1, 2), rand(2, 1, 517, 128, **half),
                     rand(2, 1, 517, 128, **half))):
        dout = torch.randn_like(q)
        first = forward_backward(q, k, v, dout)
        plans = len(fa3_fwd._plans), len(fa3_bwd._plans)
        assert min(plans) > 0, "FA3 did not run, or recorded no plan"
        replayed = forward_backward(q, k, v, dout)
        assert (len(fa3_fwd._plans), len(fa3_bwd._plans)) == plans   # a hit, not a new plan
        with runtime.kernel_options(fast_launch=False):
            plain = forward_backward(q, k, v, dout)
        for name, a, b, c in zip(("out", "lse", "dq", "dk", "dv"), first, replayed, plain):
            if name == "dq":   # summed by TMA reduce-adds from every key block, in any order
                for x in (a, c):
                    torch.testing.assert_close(b, x, rtol=2e-3, atol=2e-3 * float(x.abs().max()))
            else:
                assert torch.equal(a, b) and torch.equal(b, c), (name, (a - b).abs().max(), (b - c).abs().max())
        # fresh tensors of one layout: the first call records, the next replay on new pointers
        (B, Hq, Nq, D), (Hkv, Nk) = q.shape, k.shape[1:3]
        for call in range(3):
            run_and_check(B, Hq, Hkv, Nq, Nk, D, True, torch.float16,
                          inputs=tuple(torch.randn_like(t) for t in (q, k, v)))
            if call == 0:
                plans = len(fa3_fwd._plans), len(fa3_bwd._plans)
        assert (len(fa3_fwd._plans), len(fa3_bwd._plans)) == plans


@gpu
@pytest.mark.gpu
def test_gpu_hopper_forward_is_picked_where_it_runs(monkeypatch):
    """flash_attention's forward runs kernels/fa3_fwd.py on sm90 for large 16-bit problems at head
    dims 64/128 (with a score modifier at d128 only), and FA2 for the rest (small, host-bound calls
    included)."""
    from flashlib.kernels import fa3_fwd
    calls = []
    spy_on_version(monkeypatch, 3, lambda a, kw: calls.append(a[0].shape))
    on = {"fa3": True}                                                 # whatever FLASHLIB_FA3 says
    big = rand(2, 8, 4096, 128, dtype=torch.bfloat16)
    flash_attention(big, big, big, causal=True, kernel_options=on)
    flash_attention(big, big, big, softcap=20.0, kernel_options=on)    # a modifier, at d128: FA3
    d64 = rand(2, 8, 8192, 64, dtype=torch.bfloat16)
    flash_attention(d64, d64, d64, softcap=20.0, kernel_options=on)    # at d64: FA2
    flash_attention(d64, d64, d64, causal=True, kernel_options=on)     # d64 causal: FA3
    flash_attention(d64, d64, d64, kernel_options=on)                  # d64: FA3
    small = rand(1, 2, 300, 128, dtype=torch.bfloat16)
    flash_attention(small, small, small, kernel_options=on)            # host-bound: FA2
    flash_attention(big, big, big, kernel_options={"fa3": False})      # turned off: FA2
    hopper = fa3_fwd.supported(big, big, big)
    assert calls == ([big.shape] * 2 + [d64.shape] * 2 if hopper else []), (runtime.gpu_name(), calls)
    assert 4 * 2 * 8 * 4096 * 4096 * 128 // 2 >= runtime.KernelOptions().fa3_from_flops > 4 * 2 * 300 * 300 * 128


@gpu
@pytest.mark.gpu
def test_gpu_hopper_backward_is_picked_and_right(monkeypatch):
    """flash_attention's backward runs kernels/fa3_bwd.py for large problems on sm90 (score
    modifiers included, after FA2's forward too), FA2's kernels elsewhere, and its gradients pass
    the oracle's tolerance, ragged and grouped, causal with rows that see no key."""
    from flashlib.kernels import fa3_bwd
    calls = []
    spy_on_version(monkeypatch, 3, lambda a, kw: calls.append(a[0].shape), backward=True)
    with runtime.kernel_options(fa3=True):
        run_and_check(1, 8, 2, 7000, 6001, 128, True, torch.bfloat16)    # ragged, grouped, rows past keys
        run_and_check(3, 4, 4, 5000, 5100, 64, False, torch.float16)
        hopper = fa3_bwd.supported(*(rand(1, 8, 64, 128, dtype=torch.bfloat16) for _ in range(3)))
        assert calls == ([(1, 8, 7000, 128), (3, 4, 5000, 64)] if hopper else []), (runtime.gpu_name(), calls)
        run_and_check(1, 2, 2, 300, 300, 128, True, torch.bfloat16)      # small: FA2's kernels
        assert len(calls) == (2 if hopper else 0)
    with runtime.kernel_options(fa3=True, fa3_from_flops=0):             # any size from here
        run_and_check(1, 4, 2, 1000, 1100, 128, True, torch.bfloat16, softcap=30.0)   # FA3's forward
        run_and_check(1, 4, 2, 1000, 1100, 64, True, torch.bfloat16, softcap=30.0)    # FA2's forward
    assert calls[2:] == ([(1, 4, 1000, 128), (1, 4, 1000, 64)] if hopper else [])


@pytest.mark.skipif(runtime.DEVICE.type == "cuda", reason="CPU-only check")
def test_triton_imported_first_gives_a_clear_error():
    import subprocess
    import sys
    code = ("import triton, flashlib, torch\n"
            "x = torch.randn(1, 1, 4, 16)\n"
            "flashlib.flash_attention(x, x, x)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode != 0
    assert "put `import flashlib` before `import triton`" in run.stderr


def test_autotuning_key_tells_batch_heads_apart():
    # a first call on a 2-head slice must not pick the tile for 64 heads (kernels.config)
    from flashlib.kernels.config import size_bucket
    assert size_bucket(16384, 16384, slices=2) != size_bucket(16384, 16384, slices=64)
    assert size_bucket(16384, 16384, slices=2) != size_bucket(8192, 8192, slices=2)
    assert size_bucket(9000, 300, slices=40) == size_bucket(16384, 16384, slices=64)   # buckets


def test_launch_helpers_match_triton():
    # kernels.config's plain-Python next_power_of_2 / cdiv stand in for Triton's (host time)
    import triton
    from flashlib.kernels.config import cdiv, next_power_of_2, padded_headdim
    for n in range(1, 1100):
        assert next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 3, 16, 64, 128):
            assert cdiv(n, d) == triton.cdiv(n, d)
    assert next_power_of_2(0) == 1
    assert [padded_headdim(d) for d in (1, 16, 17, 80, 128, 200)] == [16, 16, 32, 128, 128, 256]


def test_small_and_float32_problems_are_not_autotuned(monkeypatch):
    # autotuning compiles every config per shape: only problems of TUNE_FROM_SCORES scores or
    # more are tuned; smaller ones take the first config that fits, as with autotuning off
    import triton
    from flashlib.kernels import config, fa2_fwd
    monkeypatch.setattr(config.runtime, "INTERPRET", False)   # a GPU's configs, not the interpreter's
    choose = config.tuned(fa2_fwd._fa2_fwd_kernel, [(128, 128, 8, 3), (64, 64, 4, 2)],
                          lambda bm, bn: (bm, 2 * bn))
    with config.compiling_for(config.Target((8, 0), 64 * 1024)):   # 64 KB a block
        kernel, launch_kwargs = choose(64, 2, config.TUNE_FROM_SCORES - 1, autotune=True)
        assert kernel is fa2_fwd._fa2_fwd_kernel
        assert launch_kwargs == dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)  # 128s: too big
        kernel, launch_kwargs = choose(64, 2, config.TUNE_FROM_SCORES, autotune=True)
        assert isinstance(kernel, triton.runtime.Autotuner) and launch_kwargs == {}
        assert choose(64, 2, config.TUNE_FROM_SCORES, autotune=False)[0] is fa2_fwd._fa2_fwd_kernel
        # float32's exact dots compile slowly per config: never swept, whatever the size
        kernel, launch_kwargs = choose(64, 4, 64 * config.TUNE_FROM_SCORES, autotune=True)
        assert kernel is fa2_fwd._fa2_fwd_kernel and "BLOCK_M" in launch_kwargs


def test_autotuned_choices_are_saved_for_the_next_process(monkeypatch, tmp_path):
    # a second process (a fresh SavedChoices on the same kernel) finds the first's choice on disk
    # instead of timing every config again; keys holding jit functions are stored by name
    import json
    import types

    import triton
    from flashlib.kernels import config, fa2_fwd, tile
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))
    monkeypatch.setattr(config.torch.cuda, "current_device", lambda: 0)

    def on_gpu(name, capability):
        monkeypatch.setattr(config.torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
            name=name, major=capability[0], minor=capability[1]))
        return config.SavedChoices(fa2_fwd._fa2_fwd_kernel)

    key = (4096 * 2048 + 64, 64, True, "ieee", tile.tile_update, "torch.float16")
    first = on_gpu("NVIDIA H200", (9, 0))
    assert key not in first
    first[key] = triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3)
    second = on_gpu("NVIDIA H200", (9, 0))
    assert key in second and key[:-1] + ("torch.bfloat16",) not in second
    chosen = second[key]
    assert (chosen.kwargs, chosen.num_warps, chosen.num_stages) == ({"BLOCK_M": 128, "BLOCK_N": 64}, 8, 3)
    assert key not in on_gpu("NVIDIA A100", (8, 0))          # another GPU's choices are its own
    with open(second.path, "w") as f:                          # an entry without its fields: none
        json.dump({str(key): {"kwargs": {"BLOCK_M": 64}}}, f)
    assert str(key) in json.load(open(second.path)) and key not in on_gpu("NVIDIA H200", (9, 0))
    with open(second.path, "w") as f:                          # an unreadable file counts as none
        f.write("{not json")
    assert key not in on_gpu("NVIDIA H200", (9, 0))


def test_torch_compile_traces_the_whole_call_and_matches_eager():
    # under torch.compile flash_attention is one opaque op per direction (fullgraph: no
    # graph break), running the same kernels as eager: outputs and gradients are bit-equal
    q = rand(2, 33, 4, 16, dtype=torch.float32).transpose(1, 2).requires_grad_()  # (B, H, N, D) view
    k, v = (rand(2, 2, 50, 16, dtype=torch.float32).requires_grad_() for _ in range(2))
    dout = rand(2, 4, 33, 16, dtype=torch.float32)

    def attend(q, k, v):
        return flash_attention(q, k, v, causal=True, return_lse=True)
    results = []
    for fn in (torch.compile(attend, fullgraph=True, backend="aot_eager"), attend):
        out, lse = fn(q, k, v)
        results.append((out, lse, *torch.autograd.grad(out, (q, k, v), dout)))
    for name, compiled, eager in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(compiled, eager), name


def test_torch_compile_takes_score_modifiers_and_kernel_options():
    # the custom op gets the modifiers as Modifiers.op_args and the options as KernelOptions.op_args
    # (the options resolved while tracing, not looked up by a number the trace never registered)
    q = rand(1, 2, 33, 16, dtype=torch.float32).requires_grad_()
    k, v = (rand(1, 2, 40, 16, dtype=torch.float32).requires_grad_() for _ in range(2))
    slopes = torch.rand(2, device=DEV)

    def attend(q, k, v):
        return flash_attention(q, k, v, causal=True, softcap=3.0, alibi_slopes=slopes,
                               kernel_options={"fa3": False, "fa3_fold_scale": False})
    results = []
    for fn in (torch.compile(attend, fullgraph=True, backend="aot_eager"), attend):
        out = fn(q, k, v)
        results.append((out, *torch.autograd.grad(out.sum(), (q, k, v))))
    for name, compiled, eager in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(compiled, eager), name


def test_custom_ops_pass_torch_opcheck():
    # schema, fake (meta) outputs with the real strides; the ops have no autograd of their own
    # (ops.OpAttention is theirs: the compile tests above compare its gradients with eager's)
    from flashlib import ops
    from flashlib.kernels import score_mod
    q = rand(1, 7, 4, 16, dtype=torch.float32).transpose(1, 2)
    k, v = (rand(1, 2, 9, 16, dtype=torch.float32) for _ in range(2))
    slopes = torch.rand(4, device=DEV)
    none, mods = score_mod.NO_MODIFIERS.op_args(), score_mod.Modifiers(5.0, slopes).op_args()
    options = runtime.OPTIONS.op_args()
    out, lse = ops._fa2_forward_op(q, k, v, True, 0.25, *none, options)
    torch.library.opcheck(ops._fa2_forward_op, (q, k, v, True, 0.25, *mods, options))
    torch.library.opcheck(ops._fa2_backward_op, (q.detach(), k, v, out, lse, torch.randn_like(out), True, 0.25,
                                                 *none, options))
    torch.library.opcheck(ops._fa2_backward_op, (q.detach(), k, v, out, lse, torch.randn_like(out), True, 0.25,
                                                 *mods, options))


def test_autotuning_keys_the_code_a_kernel_runs(monkeypatch):
    # a config tuned for plain scores must not be reused for a softcap (or packed sequences, or
    # another tile update) of the same size: every constexpr that chooses code is in the key
    from flashlib.kernels import block_sparse, config, fa1, fa2_bwd, fa2_fwd
    monkeypatch.setattr(config.runtime, "INTERPRET", False)
    kernels = [(k, config.KEY) for k in (fa2_fwd._fa2_fwd_kernel, fa2_bwd._dkdv_kernel,
                                         fa2_bwd._dq_kernel, fa1._fa1_fwd_kernel)]
    kernels += [(k, block_sparse.KEY) for k in (block_sparse._bs_fwd_kernel,
                                                block_sparse._bs_dkdv_kernel, block_sparse._bs_dq_kernel)]
    for kernel, key in kernels:
        autotuner, _ = config.tuned(kernel, [(64, 64, 4, 2)], lambda bm, bn: (bm, bn), key=key)(
            64, 2, config.TUNE_FROM_SCORES, autotune=True)
        choosers = {"SCORE_MOD", "TILE_UPDATE", "VARLEN", "CAUSAL"} & set(kernel.arg_names)
        assert choosers <= set(autotuner.keys), (kernel.__name__, choosers - set(autotuner.keys))
    assert "SCORE_MOD" in fa2_fwd._fa2_fwd_kernel.arg_names   # the check above is not vacuous
