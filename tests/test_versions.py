"""The numbered kernel registry (flashlib.kernels.dispatch), the choice it makes for a call, the
kernel options (flashlib.runtime.KernelOptions), the lessons' checks (flashlib.teach.versions) and
the FA1 kernel behind version 1.

CPU: every registered version against attention_ref through Triton's interpreter at small,
irregular shapes (N in {1, 17, 97, 130}, Nq != Nk, head dim 80, 9 heads, grouped heads, causal).
GPU (marked ``gpu``): real sizes, float16 and bfloat16, head dims 64/80/128.
"""
import inspect

import numpy as np
import pytest
import torch

from flashlib import runtime
from flashlib.kernels import dispatch, score_mod
from flashlib.teach import versions, viz
from flashlib.kernels.fa1 import fa1_forward, scratch_bytes
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import assert_close

DEV = runtime.DEVICE
gpu = pytest.mark.skipif(DEV.type != "cuda", reason="needs a CUDA GPU")


def test_every_version_is_described_and_shares_the_signature():
    assert versions.VERSIONS is dispatch.VERSIONS                 # one registry, the core's
    assert list(versions.VERSIONS) == sorted(versions.VERSIONS) == list(range(1, len(versions.VERSIONS) + 1))
    for n, version in versions.VERSIONS.items():
        assert version.number == n and version.description and len(version.description) < 120
        for fn in filter(None, (version.forward, version.backward)):
            params = inspect.signature(fn).parameters
            assert list(params)[:3] == ["q", "k", "v"], n
            for name in ("causal", "scale"):
                assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (n, name)
        assert f"{n}  {version.forward.__name__}" in versions.__doc__, f"version {n} is missing from the header"
        assert f"\n    {n}  " in dispatch.__doc__, f"version {n} is missing from dispatch's header"
    # what the dispatcher tries: known versions, each with a backward, the last taking every call
    assert set(dispatch.DISPATCH_ORDER) <= set(dispatch.VERSIONS)
    assert all(dispatch.VERSIONS[n].backward is not None for n in dispatch.DISPATCH_ORDER)
    assert dispatch.VERSIONS[dispatch.DISPATCH_ORDER[-1]].supports is dispatch.always


def test_the_dispatcher_picks_by_the_options_of_the_call(monkeypatch):
    # version 3 stood in for (its predicates ask fa3_fwd/fa3_bwd.supported, replaced here): it takes
    # large enough problems with FA3 on, a score modifier only at fa3_fwd_mod_head_dims
    from flashlib.kernels import fa3_bwd, fa3_fwd
    monkeypatch.setattr(fa3_fwd, "supported", lambda q, k, v, packed=False: True)
    monkeypatch.setattr(fa3_bwd, "supported", lambda q, k, v, out, lse, dout, packed=False: True)
    q = torch.zeros(2, 4, 64, 128)                                # 4 B H N N D = 2^24 FLOPs
    plain, softcap = score_mod.IDENTITY, score_mod.make(q, score_mod.Modifiers(softcap=5.0))
    base = runtime.KernelOptions(fa3_from_flops=1 << 24)

    def picked(mod=plain, causal=False, q=q, **changes):
        options = base.replace(**changes)
        forward = dispatch.forward_version(q, q, q, causal, mod, options).number
        backward = dispatch.backward_version(q, q, q, q, q, q, causal, mod, options).number
        return forward, backward
    assert picked() == (3, 3)
    assert picked(causal=True) == (2, 2)                          # half the FLOPs: under the threshold
    assert picked(fa3=False) == (2, 2)
    assert picked(fa3_from_flops=(1 << 24) + 1) == (2, 2)
    assert picked(softcap) == (3, 3)                              # d128: in fa3_fwd_mod_head_dims
    assert picked(softcap, q=torch.zeros(2, 8, 64, 64)) == (2, 3)  # d64: FA2's forward, FA3's backward
    assert picked(softcap, q=torch.zeros(2, 8, 64, 64), fa3_fwd_mod_head_dims=(64, 128)) == (3, 3)
    packed = torch.zeros(128, 4, 128)                             # 2 sequences of 64: max_seqlen 64
    assert dispatch.forward_version(packed, packed, packed, False, plain, base, (None, None), (64, 64)).number == 3


def test_kernel_options_are_read_once_checked_and_overridable():
    env = runtime.KernelOptions.from_env({"FLASHLIB_FA3": "0", "FLASHLIB_AUTOTUNE": "1", "FLASHLIB_FAST_LAUNCH": "0"})
    assert (env.fa3, env.autotune, env.fast_launch) == (False, True, False)
    assert runtime.KernelOptions.from_env({}) == runtime.KernelOptions()
    before = runtime.OPTIONS
    with runtime.kernel_options(fa3=False) as inside:
        assert runtime.OPTIONS is inside and not inside.fa3 and runtime.options() is inside
        assert runtime.options({"autotune": False}) == inside.replace(autotune=False)
    assert runtime.OPTIONS is before
    assert runtime.options({"fa3": False}) is runtime.options({"fa3": False})   # cached: no object per call
    for options in (before, before.replace(fa3=False, fa3_smem_bytes=1 << 17, fa3_fwd_mod_head_dims=(64, 128))):
        assert runtime.from_op_args(options.op_args()) == options          # what a custom op receives
        assert all(type(x) is int for x in options.op_args())
    with pytest.raises(TypeError, match="unknown kernel option 'fa4'"):
        runtime.options({"fa4": True})
    with pytest.raises(TypeError, match="fa3_from_flops must be int"):
        runtime.KernelOptions().replace(fa3_from_flops=True)
    with pytest.raises(TypeError, match="kernel_options must be a dict"):
        runtime.options([("fa3", False)])
    q = torch.randn(1, 2, 17, 16, device=DEV)
    with pytest.raises(TypeError, match="unknown kernel option 'fast'"):
        __import__("flashlib").flash_attention(q, q, q, kernel_options={"fast": True})


RUNNABLE = [n for n in sorted(versions.VERSIONS) if n != 3]   # 3: Hopper, 16-bit (tested below)


@pytest.mark.parametrize("shape", versions.CHECK_SHAPES, ids=str)
@pytest.mark.parametrize("n", RUNNABLE)
def test_version_matches_reference_float32(n, shape):
    errors = versions.check_version(n, shapes=[shape], dtype=torch.float32)
    assert len(errors) == 1 and errors[0] < 1e-4


@pytest.mark.parametrize("n", RUNNABLE)
def test_version_matches_reference_float16(n):
    versions.check_version(n, shapes=[(1, 9, 3, 97, 130, 80, True)], dtype=torch.float16)


def test_check_version_rejects_a_wrong_kernel(monkeypatch):
    def off_by_a_scale(q, k, v, *, causal=False, scale=None):
        return fa1_forward(q, k, v, causal=causal, scale=0.9 / q.shape[-1] ** 0.5)

    wrong = dispatch.Version(99, off_by_a_scale, None, dispatch.never, dispatch.never, "FA1, a wrong scale")
    monkeypatch.setitem(versions.VERSIONS, 99, wrong)
    with pytest.raises(AssertionError, match="version 99"):
        versions.check_version(99, shapes=[(1, 1, 1, 17, 33, 16, False)])
    with pytest.raises(ValueError, match="unknown kernel version"):
        versions.check_version(7)


def test_fa1_strides_scale_and_bfloat16():
    # (B, N, H, D) storage viewed as (B, H, N, D); bfloat16 is upcast through the interpreter
    q = torch.randn(1, 33, 4, 80, dtype=torch.bfloat16, device=DEV).transpose(1, 2)
    k = torch.randn(1, 70, 2, 80, dtype=torch.bfloat16, device=DEV).transpose(1, 2)
    v = torch.randn(1, 70, 2, 80, dtype=torch.bfloat16, device=DEV).transpose(1, 2)
    out, lse = fa1_forward(q, k, v, causal=True, scale=0.3)
    ref, ref_lse = attention_ref(q, k, v, causal=True, scale=0.3)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert_close(out, ref, baseline=attention_naive(q, k, v, causal=True, scale=0.3))
    assert_close(lse, ref_lse, baseline=ref_lse.float(), dtype=torch.float32, name="lse")


def test_fa1_rows_with_no_key_are_zero_not_nan():
    q, k, v = (torch.randn(1, 2, n, 16, device=DEV) for n in (97, 17, 17))
    out, lse = fa1_forward(q, k, v, causal=True)
    empty = 97 - 17                                   # bottom-right: the first 80 rows see nothing
    assert torch.all(out[:, :, :empty] == 0) and torch.all(lse[:, :, :empty] == float("-inf"))
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, empty:]).all()


def test_fa1_rejects_bad_input_by_name():
    q, k = torch.randn(1, 6, 17, 16, device=DEV), torch.randn(1, 4, 17, 16, device=DEV)
    with pytest.raises(ValueError, match="heads_q=6 is not a multiple of heads_kv=4"):
        fa1_forward(q, k, k)


@pytest.mark.parametrize("Nq, Nk", [(130, 97), (17, 130), (97, 97), (1, 130), (130, 1)])
def test_scratch_bytes_counts_the_visited_tiles(Nq, Nk):
    D, bm, bn = 80, 64, 32
    n_k = -(-Nk // bn)
    assert scratch_bytes(Nq, Nk, D, block_m=bm, block_n=bn) == 4 * (D + 2) * Nq * (2 + 2 * n_k)
    # causal: the kernel's loop bounds against lesson 04's independent tile classification
    states = viz.tile_states(Nq, Nk, bm, bn, causal=True)             # (query blocks, key blocks)
    rows = np.minimum(bm, Nq - bm * np.arange(states.shape[0]))        # rows in each query block
    visits = int(((states > 0) * rows[:, None]).sum())
    assert scratch_bytes(Nq, Nk, D, block_m=bm, block_n=bn, causal=True, batch_heads=3) == \
        3 * 4 * (D + 2) * (2 * Nq + 2 * visits)


@pytest.mark.skipif(DEV.type == "cuda", reason="checks the CPU refusal")
def test_time_version_needs_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        versions.time_version(1)


GPU_CASES = [  # (B, Hq, Hkv, Nq, Nk, D, causal)
    (2, 16, 16, 1024, 1024, 64, False),
    (2, 16, 4, 2048, 2048, 128, True),
    (1, 8, 8, 1000, 3001, 80, True),
    (1, 4, 2, 4097, 1023, 64, True),
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", RUNNABLE)
def test_gpu_versions_at_real_sizes(n, dtype):
    versions.check_version(n, shapes=GPU_CASES, dtype=dtype)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_hopper_version_at_real_sizes(dtype):
    if not versions.available(3):
        pytest.skip(f"version 3 needs an sm90 GPU; this is {runtime.gpu_name()}")
    versions.check_version(3, dtype=dtype)
    versions.check_version(3, shapes=[(2, 16, 4, 4097, 4097, 128, True), (4, 6, 6, 1000, 3001, 64, False),
                                      (1, 8, 8, 3001, 777, 128, True)], dtype=dtype)


def test_hopper_version_says_what_it_needs_where_it_cannot_run():
    if versions.available(3):
        pytest.skip("this machine runs version 3")
    with pytest.raises(RuntimeError, match="needs an sm90 GPU"):
        versions.check_version(3)


@gpu
@pytest.mark.gpu
def test_gpu_time_version_checks_then_times():
    result = versions.time_version(1, B=1, H=4, N=1024, D=64)
    assert result["ms"] > 0 and result["tflops"] > 0
