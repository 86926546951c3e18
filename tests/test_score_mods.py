"""The score-modifier hook (flashlib/kernels/score_mod.py): softcap and ALiBi in every kernel.

Each public function (dense forward and backward, block-sparse, decode) is checked against the
float64 oracle with the same modifiers (``attention_ref(softcap=, alibi_slopes=)``), on irregular
shapes with grouped heads, causal and not, with flashlib.testing's rule. Also: the exact cases
(all-zero scores, zero slopes), large logits, the identity staying the default, bad values.
GPU tests (marked ``gpu``) at real sizes.
"""
import math

import pytest
import torch

from flashlib import masks, runtime
from flashlib.decode import flash_decode
from flashlib.inputs import check_score_mods
from flashlib.kernels import score_mod
from flashlib.ops import block_sparse_attention, flash_attention
from flashlib.testing import assert_attention_close
from test_block_sparse import check_block_sparse, qkv
from test_flash_attention import hopper_kernels, run_and_check, skip_without_hopper, spy_on_version  # noqa: F401

DEV = runtime.DEVICE
gpu = pytest.mark.skipif(DEV.type != "cuda", reason="needs a CUDA GPU")


def slopes(*shape):
    """ALiBi's geometric slopes (Press et al.: 2^(-8 h / H)) for the last dim, varied over the rest."""
    H = shape[-1]
    base = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
    return (base * torch.linspace(0.5, 1.5, math.prod(shape[:-1]))[:, None]).reshape(shape).to(DEV)


MODS = {
    "softcap": lambda B, H: dict(softcap=2.5),
    "alibi_per_head": lambda B, H: dict(alibi_slopes=slopes(H)),
    "alibi_per_batch_head": lambda B, H: dict(alibi_slopes=slopes(B, H)),
    "softcap_alibi": lambda B, H: dict(softcap=4.0, alibi_slopes=slopes(B, H)),
}


@pytest.mark.parametrize("mod", MODS)
@pytest.mark.parametrize("causal", [False, True])
def test_dense_forward_and_backward(mod, causal):
    # 37 queries over 53 keys (ragged tiles, bottom-right causal), 6 heads over 2, head dim 24
    run_and_check(2, 6, 2, 37, 53, 24, causal, torch.float32, **MODS[mod](2, 6))


def test_dense_more_queries_than_keys_float16():
    run_and_check(1, 4, 4, 70, 20, 16, True, torch.float16, softcap=3.0, alibi_slopes=slopes(4))


def test_large_logits_are_capped():
    # scores of several hundred: the softcap bounds them; no overflow, no NaN, gradients right
    q, k, v = qkv(1, 2, 1, 33, 45, 32)
    run_and_check(1, 2, 1, 33, 45, 32, True, torch.float32, inputs=(q * 40, k * 40, v), softcap=30.0)


def test_exact_cases():
    # all scores 0: capped, still 0, so every row is the mean of v, exactly up to the sum's rounding
    q, k, v = qkv(1, 2, 1, 9, 13, 16)
    out = flash_attention(torch.zeros_like(q), k, v, softcap=1.0)
    torch.testing.assert_close(out, v.mean(2, keepdim=True).expand_as(out), rtol=0, atol=1e-6)
    # zero slopes add nothing: the same result as no modifier
    plain = flash_attention(q, k, v, causal=True)
    zero = flash_attention(q, k, v, causal=True, alibi_slopes=torch.zeros(2, device=DEV))
    torch.testing.assert_close(zero, plain, rtol=0, atol=1e-6)


def test_identity_is_the_default_and_modifiers_travel_as_one_value():
    q, k, v = qkv(1, 2, 1, 8, 8, 16)
    assert score_mod.make(q, score_mod.NO_MODIFIERS) is score_mod.IDENTITY
    assert score_mod.make(q, score_mod.Modifiers(None, None)).fn is score_mod.identity
    assert check_score_mods(q) is score_mod.NO_MODIFIERS
    slopes = torch.ones(2, device=DEV)
    mods = check_score_mods(q, softcap=3, alibi_slopes=slopes)
    assert mods == score_mod.Modifiers(3.0, slopes) and isinstance(mods.softcap, float)
    # what torch's custom ops take in its place, and back: NaN and None for an absent modifier
    for mods in (score_mod.NO_MODIFIERS, score_mod.Modifiers(softcap=3.0), score_mod.Modifiers(alibi_slopes=slopes),
                 mods):
        floats, tensors = mods.op_args()
        assert len(floats) == len(score_mod.FLOAT_FIELDS) and len(tensors) == len(score_mod.TENSOR_FIELDS)
        assert score_mod.Modifiers.from_op_args(floats, tensors) == mods
    assert set(score_mod.FLOAT_FIELDS + score_mod.TENSOR_FIELDS) == set(score_mod.Modifiers._fields)


def test_the_one_instruction_tanh_only_for_bfloat16_on_a_gpu():
    # tanh.approx.f32 errs up to 2^-10.99: under bfloat16's rounding, not float16's or float32's
    for dtype in (torch.float16, torch.float32, torch.bfloat16):
        q = torch.zeros(1, 2, 4, 16, dtype=dtype, device=DEV)
        approx = dtype == torch.bfloat16 and DEV.type == "cuda"
        capped = score_mod.make(q, score_mod.Modifiers(30.0))
        assert capped.fn is (score_mod.tanh_softcap_approx if approx else score_mod.tanh_softcap)
        both = score_mod.make(q, score_mod.Modifiers(30.0, torch.ones(2, device=DEV)))
        assert both.fn is (score_mod.tanh_softcap_approx_alibi_bias if approx else score_mod.tanh_softcap_alibi_bias)


def launched_tile_update(q, k, v, **options):
    """The TILE_UPDATE and m_init the dense forward launches with (recorded, not run)."""
    from flashlib.kernels import fa2_fwd
    recorded = []
    with runtime.kernel_options(launch_hook=lambda kernel, grid, args, kw: recorded.append((args, kw))):
        fa2_fwd.fa2_forward(q, k, v, score_mod=score_mod.make(q, score_mod.Modifiers(**options)))
    (args, kw), = recorded
    return kw["TILE_UPDATE"], args[list(fa2_fwd._fa2_fwd_kernel.arg_names).index("m_init")]


def test_a_softcap_alone_drops_the_running_max_where_p_has_the_range():
    # bounded scores need no running max (tile.tile_update_bounded) when P is bfloat16 or float32;
    # float16's range is too short, ALiBi's bias unbounded, and caps over 55.4 too wide
    from flashlib.kernels import tile
    for dtype, options, bounded in [(torch.float32, dict(softcap=30.0), True),
                                    (torch.bfloat16, dict(softcap=50.0), True),
                                    (torch.float16, dict(softcap=30.0), False),
                                    (torch.float32, dict(softcap=30.0, alibi_slopes=torch.ones(2)), False),
                                    (torch.float32, dict(softcap=60.0), False),
                                    (torch.float32, {}, False)]:
        q = torch.randn(1, 2, 8, 16).to(dtype)
        fn, m_init = launched_tile_update(q, q, q, **options)
        assert (fn is tile.tile_update_bounded) == bounded, (dtype, options)
        assert m_init == (max(0.0, options["softcap"] * math.log2(math.e) - 56) if bounded else float("-inf"))


def test_causal_alibi_splits_its_bias_in_the_unmasked_blocks():
    # causal ALiBi alone: blocks wholly before the diagonal take key and row terms instead of the
    # hook (fa2_fwd.attend_key_blocks), the library's own tile update only; other modifiers never
    from flashlib.kernels import fa2_fwd
    q = torch.randn(1, 2, 8, 16)
    for causal, options, tile_update, split in [(True, dict(alibi_slopes=torch.ones(2)), None, True),
                                                (False, dict(alibi_slopes=torch.ones(2)), None, False),
                                                (True, dict(softcap=5.0, alibi_slopes=torch.ones(2)), None, False),
                                                (True, dict(softcap=5.0), None, False), (True, {}, None, False),
                                                (True, dict(alibi_slopes=torch.ones(2)), fa2_fwd.tile_update_fn, False)]:
        recorded = []
        with runtime.kernel_options(launch_hook=lambda kernel, grid, args, kw: recorded.append(kw)):
            mod = score_mod.make(q, score_mod.Modifiers(**options))
            fa2_fwd.fa2_forward(q, q, q, causal=causal, score_mod=mod, tile_update=tile_update)
        assert recorded[0]["ALIBI_SPLIT"] == split, (causal, options, tile_update)
    # several unmasked blocks per query block (64 x 64 tiles here), steep slopes (far blocks' row
    # terms over 1000 in base 2), more keys than queries and the other way round, grouped heads
    run_and_check(1, 4, 2, 200, 333, 16, True, torch.float32, alibi_slopes=slopes(4) * 8)
    run_and_check(2, 2, 1, 300, 150, 24, True, torch.float32, alibi_slopes=slopes(2, 2))
    run_and_check(1, 2, 2, 260, 260, 32, True, torch.float16, alibi_slopes=slopes(2) * 0.01)


@pytest.mark.parametrize("cap", [1.0, 50.0, 55.0])
def test_bounded_softmax_at_the_edges_of_its_range(cap):
    # every score at -cap (the smallest p the fixed offset must keep normal), scores at +cap, and
    # rows with no key to see (causal, more queries than keys), float32 through the bounded update
    q, k, v = qkv(1, 2, 1, 41, 29, 32)
    ones = torch.ones_like(q[..., :1, :]) * 10                        # (1, 2, 1, 32)
    for qs, ks in ((ones.expand_as(q), -ones[:, :1].expand_as(k)), (ones.expand_as(q), ones[:, :1].expand_as(k)),
                   (q * 40, k * 40)):
        run_and_check(1, 2, 1, 41, 29, 32, True, torch.float32, inputs=(qs.contiguous(), ks.contiguous(), v),
                      softcap=cap)


@pytest.mark.parametrize("mod", ["softcap", "softcap_alibi"])
def test_block_sparse(mod):
    q, k, v = qkv(2, 4, 2, 75, 90, 16)
    mask = masks.sliding_window(75, 90, 24, block_size=16, device=DEV)
    check_block_sparse(q, k, v, mask, mask.to_dense(), **MODS[mod](2, 4))


def test_block_sparse_with_a_bitmap_mask():
    q, k, v = qkv(1, 2, 2, 50, 50, 16, seed=3)
    mask = masks.random_blocks(50, 50, 0.6, block_size=16, seed=1, device=DEV)
    check_block_sparse(q, k, v, mask, mask.to_dense(), alibi_slopes=slopes(2))


@pytest.mark.parametrize("Nq", [1, 3])
def test_decode_ragged_batch(Nq):
    # 6 query heads over 2: several heads in one tile, each with its own slope
    B, Hq, Hkv, Lmax, D = 3, 6, 2, 70, 16
    q = torch.randn(B, Hq, Nq, D, device=DEV)
    k, v = (torch.randn(B, Hkv, Lmax, D, device=DEV) for _ in range(2))
    lens = torch.tensor([70, 33, 2], device=DEV)
    mods = dict(softcap=3.0, alibi_slopes=slopes(B, Hq))
    out, lse = flash_decode(q, k, v, cache_seqlens=lens, num_splits=3, return_lse=True, **mods)
    for b, L in enumerate(lens.tolist()):
        sl = slice(b, b + 1)
        assert_attention_close(out[sl], lse[sl], q[sl], k[sl, :, :L], v[sl, :, :L], causal=True,
                               softcap=3.0, alibi_slopes=mods["alibi_slopes"][sl],
                               name=f"sequence {b} (L={L})")


BAD = [
    (dict(softcap=0.0), ValueError, "softcap must be a positive"),
    (dict(softcap=-1.0), ValueError, "softcap must be a positive"),
    (dict(softcap=float("nan")), ValueError, "softcap must be a positive"),
    (dict(softcap=True), ValueError, "softcap must be a positive"),
    (dict(alibi_slopes=[0.5, 0.25]), TypeError, "alibi_slopes must be a torch.Tensor"),
    (dict(alibi_slopes=torch.ones(2, dtype=torch.float64)), TypeError, "alibi_slopes has dtype"),
    (dict(alibi_slopes=torch.ones(3)), ValueError, r"alibi_slopes must have shape \(2,\) or \(1, 2\)"),
    (dict(alibi_slopes=torch.ones(2, 2)), ValueError, "alibi_slopes must have shape"),
    (dict(alibi_slopes=torch.tensor([1.0, math.inf])), ValueError, "not finite"),   # read once a tensor
]


@pytest.mark.parametrize("bad, error, match", BAD)
@pytest.mark.parametrize("attend", ["dense", "block_sparse", "decode"])
def test_bad_values_name_the_argument(attend, bad, error, match):
    q, k, v = qkv(1, 2, 1, 4, 8, 16)
    bad = {name: value.to(DEV) if isinstance(value, torch.Tensor) else value for name, value in bad.items()}
    call = {"dense": lambda: flash_attention(q, k, v, **bad),
            "block_sparse": lambda: block_sparse_attention(q, k, v, torch.ones(1, 1, dtype=torch.bool,
                                                                               device=DEV), block_size=16, **bad),
            "decode": lambda: flash_decode(q, k, v, **bad)}[attend]
    with pytest.raises(error, match=match):
        call()


def test_torch_compile_passes_the_modifiers():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 20, 30, 16))
    mods = dict(softcap=5.0, alibi_slopes=slopes(4))

    def attend(q, k, v):
        return flash_attention(q, k, v, causal=True, **mods)
    results = []
    for fn in (torch.compile(attend, fullgraph=True, backend="aot_eager"), attend):
        out = fn(q, k, v)
        results.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    for name, compiled, eager in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(compiled, eager), name


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_real_sizes(dtype, D):
    run_and_check(2, 8, 2, 1500, 2100, D, True, dtype, softcap=30.0, alibi_slopes=slopes(2, 8))
    # causal ALiBi alone: FA2's forward splits its bias in the unmasked blocks (fa2_fwd), steep
    # slopes too (far blocks' row terms in the thousands)
    run_and_check(2, 8, 2, 1500, 2100, D, True, dtype, alibi_slopes=slopes(2, 8) * 4)
    run_and_check(1, 4, 4, 777, 500, D, True, dtype, alibi_slopes=slopes(4))          # Nq > Nk
    run_and_check(1, 4, 4, 2048, 2048, D, False, dtype, softcap=50.0)
    # scores across tanh's bend and into saturation (|s| up to ~100 over a cap of 30), where the
    # GPU's one-instruction tanh (tanh.approx.f32) errs most in absolute terms
    q, k, v = qkv(1, 4, 2, 1000, 1300, D, dtype=dtype)
    run_and_check(1, 4, 2, 1000, 1300, D, True, dtype, inputs=(q * 5, k * 5, v), softcap=30.0)
    # a small cap bends most scores; few keys average little of tanh's error away. bfloat16 takes
    # tanh.approx.f32 here (kernels/score_mod.py), float16 the exp2 formula
    run_and_check(1, 4, 4, 70, 20, D, True, dtype, softcap=3.0, alibi_slopes=slopes(4))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_hopper_forward_with_modifiers(monkeypatch, hopper_kernels, dtype):
    """The FA3 kernels (kernels/fa3_fwd.py, fa3_bwd.py) run the same hook: out, lse and gradients
    through flash_attention against the oracle, ragged, grouped, bottom-right causal with Nq > Nk
    (rows that see no key), every modifier, both head dims."""
    skip_without_hopper(dtype)
    calls = []
    spy_on_version(monkeypatch, 3, lambda a, kw: calls.append(kw["score_mod"].fn))
    for D in (64, 128):
        run_and_check(2, 8, 2, 1500, 2100, D, True, dtype, softcap=30.0, alibi_slopes=slopes(2, 8))
        run_and_check(1, 4, 4, 777, 500, D, True, dtype, softcap=20.0)           # Nq > Nk
        run_and_check(1, 4, 2, 1000, 1300, D, False, dtype, alibi_slopes=slopes(4))
        # ALiBi alone: its bias split into column and row terms off the diagonal (fa3_fwd._scores)
        run_and_check(2, 8, 2, 1500, 2100, D, True, dtype, alibi_slopes=slopes(2, 8) * 4)
        run_and_check(1, 4, 4, 777, 500, D, True, dtype, alibi_slopes=slopes(4))       # Nq > Nk
        q, k, v = qkv(1, 4, 2, 1000, 1300, D, dtype=dtype)                       # past tanh's bend
        run_and_check(1, 4, 2, 1000, 1300, D, True, dtype, inputs=(q * 5, k * 5, v), softcap=30.0)
    assert len(calls) == 12 and score_mod.identity not in calls


@gpu
@pytest.mark.gpu
def test_gpu_block_sparse_and_decode():
    q, k, v = qkv(1, 8, 8, 4096, 4096, 128, dtype=torch.float16)
    mask = masks.sliding_window(4096, 4096, 1000, device=DEV)
    check_block_sparse(q, k, v, mask, mask.to_dense(), softcap=30.0, alibi_slopes=slopes(8))
    qd = torch.randn(4, 32, 1, 128, dtype=torch.float16, device=DEV)
    kd, vd = (torch.randn(4, 8, 16384, 128, dtype=torch.float16, device=DEV) for _ in range(2))
    lens = torch.tensor([16384, 9000, 1, 4097], device=DEV)
    out, lse = flash_decode(qd, kd, vd, cache_seqlens=lens, return_lse=True, softcap=30.0,
                            alibi_slopes=slopes(32))
    for b, L in enumerate(lens.tolist()):
        sl = slice(b, b + 1)
        assert_attention_close(out[sl], lse[sl], qd[sl], kd[sl, :, :L], vd[sl, :, :L], causal=True,
                               softcap=30.0, alibi_slopes=slopes(32), name=f"sequence {b}")
