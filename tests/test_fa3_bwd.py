"""The FA3 backward for Hopper (flashlib/kernels/fa3_bwd.py).

CPU: the host side (variants, shared-memory plans, the ``supported`` gate, a clear error instead
of a launch, launch plans keyed on the score modifier). GPU (marked ``gpu``, on an sm90 GPU with
Triton 3.6's Gluon, skipped elsewhere): dq, dk, dv of every variant against float64 autograd
through the oracle with flashlib's tolerance rule, at real and irregular sizes: ragged lengths,
grouped heads, causal with Nq > Nk (rows with no key: zero gradients, never NaN), Nq = 1, Nk = 1,
large logits, strided views, float16 and bfloat16, head dims 64 and 128; and with each score
modifier (softcap, ALiBi, both); and on packed sequences (cu_seqlens) against the oracle sequence
by sequence.
"""
import pytest
import torch

from flashlib import runtime, testing
from flashlib.kernels import fa3_bwd, score_mod
from flashlib.reference import attention_naive, attention_ref

DEV = runtime.DEVICE
gpu = pytest.mark.skipif(DEV.type != "cuda", reason="needs a CUDA GPU")


def test_variants_fit_shared_memory():
    for defaults in (fa3_bwd.DEFAULT_VARIANT, fa3_bwd.DEFAULT_VARIANT_MODIFIED):
        assert set(defaults) == set(fa3_bwd.HEAD_DIMS)
        for D, name in defaults.items():
            assert D in fa3_bwd.VARIANTS[name].head_dims
    for name, v in fa3_bwd.VARIANTS.items():
        assert v.num_wg in (1, 2) and v.block_m in (64, 128) and v.about
        # a warp per 16 keys; two warpgroups in one consumer only as the only consumer
        assert v.block_n in (64, 128) and (v.block_n == 64 or v.num_wg == 1)
        launch = fa3_bwd.launch_options(name)
        assert launch["num_warps"] == v.block_n // 16
        if "maxnreg" in launch:   # what setmaxnreg divides: the launch count over the consumer's warps
            # and the producer's, padded to a warpgroup, within an SM's 64K registers
            assert launch["maxnreg"] * 32 * (launch["num_warps"] + 4) <= 65536, name
        for D in v.head_dims:
            config = fa3_bwd.kernel_config(name, D)
            assert 1 <= config["STAGES"] <= fa3_bwd.MAX_STAGES
            ring = 2 * config["STAGES"] * v.block_m * D * 2
            kv = 2 * v.num_wg * v.block_n * D * 2
            tiles = 1 if v.keys_m else 3 if v.dq_split else 2      # dS (two buffers when split), P
            ds_p = tiles * v.num_wg * v.block_n * v.block_m * 2
            dq_cols = D // 2 if v.dq_split else D if v.block_n == 128 else min(D, fa3_bwd.DQ_N)
            dq = v.num_wg * v.block_m * dq_cols * 4 if v.dq_tma else 0
            assert config["DQ_N"] == dq_cols and config["DQ_SPLIT"] == v.dq_split
            assert config["BLOCK_N"] == v.block_n
            assert ring + kv + ds_p + dq <= fa3_bwd.SMEM_BYTES - fa3_bwd.SMEM_SPARE, (name, D)
            if v.dq_split:   # two consumers, rows along M, a TMA reduce; dQ always issued before dK
                assert v.num_wg == 2 and not v.keys_m and v.dq_tma
                assert fa3_bwd.kernel_config(name, D, dq_before_dk=False)["DQ_FIRST"]
    with pytest.raises(ValueError, match="head dims"):
        fa3_bwd.kernel_config("2wg_keys_m", 128)


def test_unsupported_inputs_are_refused_clearly():
    q = torch.randn(1, 2, 8, 64)
    k = torch.randn(1, 1, 8, 64)
    assert not fa3_bwd.supported(q, k, k)   # CPU tensors (and, here, no Hopper GPU or Gluon)
    with pytest.raises(ValueError, match="fa2_backward"):
        fa3_bwd.fa3_backward(q, k, k, q, torch.zeros(1, 2, 8), q)


def test_launch_plans_are_keyed_on_the_score_modifier(monkeypatch):
    # a plan bakes the scores' scale (the softcap's 1 / c in it) and the modifier's function: a
    # call with another modifier or cap must not replay it, and the args tensor's layout is pinned
    keys = []
    monkeypatch.setattr(fa3_bwd, "plan_key", lambda tensors, extra, options: keys.append((tensors, extra)))
    q = torch.randn(1, 2, 8, 64)
    k = torch.randn(1, 1, 8, 64)
    made = [score_mod.Modifiers(softcap=30.0), score_mod.Modifiers(softcap=20.0),
            score_mod.Modifiers(alibi_slopes=torch.ones(2)), score_mod.Modifiers(30.0, torch.ones(2))]
    mods = [None, *(score_mod.make(q, m) for m in made)]
    for mod in mods:
        with pytest.raises(ValueError, match="fa2_backward"):   # CPU tensors: refused after the key
            fa3_bwd.fa3_backward(q, k, k, q, torch.zeros(1, 2, 8), q, score_mod=mod)
    assert len({options for _, options in keys}) == len(mods)
    for (tensors, _), mod in zip(keys, mods):
        assert (mod is None) == (len(tensors) == 6) and (mod is None or tensors[-1] is mod.args)


def test_packed_launch_plans_are_keyed_on_offsets_and_max_seqlen(monkeypatch):
    # a packed plan reads the offsets on the device and bakes the longest lengths into its grid:
    # the offsets' layout and max_seqlen are in its key (a list is keyed as the tuple it equals)
    keys = []
    monkeypatch.setattr(fa3_bwd, "plan_key", lambda tensors, extra, options: keys.append((tensors, extra)))
    q = torch.randn(12, 2, 64)
    k = torch.randn(9, 1, 64)
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32) for c in ([0, 5, 12], [0, 4, 9]))
    for max_seqlen in ([7, 5], (7, 5), (8, 5)):
        with pytest.raises(ValueError, match="fa2_backward"):   # CPU tensors: refused after the key
            fa3_bwd.fa3_backward(q, k, k, q, torch.zeros(2, 12), q, cu_seqlens=(cu_q, cu_k),
                                 max_seqlen=max_seqlen)
    (tensors, first), (_, same), (_, longer) = keys
    assert tensors[6] is cu_q and tensors[7] is cu_k and len(tensors) == 8
    assert first == same != longer


def _hopper():
    if DEV.type != "cuda" or runtime.capability(DEV)[0] != 9:
        pytest.skip(f"needs an sm90 GPU; this is {runtime.gpu_name() if DEV.type == 'cuda' else 'a CPU'}")
    if not fa3_bwd._GLUON:
        pytest.skip("needs Triton 3.6's Gluon (fa3_bwd.TESTED_TRITON)")


def check_gradients(B, Hq, Hkv, Nq, Nk, D, causal, dtype, variant=None, *, q_scale=1.0, strided=False,
                    **score_mods):
    """fa3_backward's (dq, dk, dv) from fa2_forward's (out, lse) against float64 autograd.
    score_mods: ``softcap``, ``alibi_slopes`` as in ``attention_ref``; with them (out, lse) come
    from fa3_forward with the same modifier."""
    from flashlib.kernels import fa3_fwd
    from flashlib.kernels.fa2_fwd import fa2_forward

    def make(H, N):
        if strided:   # (B, N, H, D) storage viewed as (B, H, N, D)
            return torch.randn(B, N, H, D, dtype=dtype, device=DEV).transpose(1, 2)
        return torch.randn(B, H, N, D, dtype=dtype, device=DEV)
    q, k, v, dout = make(Hq, Nq), make(Hkv, Nk), make(Hkv, Nk), make(Hq, Nq)
    if q_scale != 1.0:
        q = (q.float() * q_scale).to(dtype)
    mod = score_mod.make(q, score_mod.Modifiers(**score_mods))
    out, lse = fa3_fwd.fa3_forward(q, k, v, causal=causal, score_mod=mod) if score_mods else \
        fa2_forward(q, k, v, causal=causal)
    assert fa3_bwd.supported(q, k, v, out, lse, dout)
    grads = fa3_bwd.fa3_backward(q, k, v, out, lse, dout, causal=causal, variant=variant, score_mod=mod)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*ref_leaves, causal=causal, **score_mods)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double())
    base_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    base_grads = torch.autograd.grad(attention_naive(*base_leaves, causal=causal, **score_mods), base_leaves,
                                     dout)
    mags = testing.attention_magnitudes(q, k, v, dout, causal=causal, **score_mods)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert g.shape == r.shape and g.dtype == dtype, name
        assert torch.isfinite(g).all(), f"{name} has NaN or inf entries"
        testing.assert_close(g, r, baseline=b, dtype=dtype, name=name, magnitude=mags[name])
    return grads, lse


GPU_CASES = [  # (B, Hq, Hkv, Nq, Nk, causal)
    (2, 6, 2, 1000, 3000, False),     # ragged, grouped heads 3:1
    (2, 6, 2, 1000, 3000, True),
    (1, 4, 4, 3000, 1000, True),      # Nq > Nk causal: the first 2000 rows see no key
    (2, 4, 2, 1, 700, True),          # Nq = 1
    (1, 2, 2, 64, 1, False),          # Nk = 1: the exact dq is 0
    (1, 2, 1, 77, 77, True),          # one block, rows and keys past the sequence in it
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", fa3_bwd.HEAD_DIMS)
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_default_variant(case, D, dtype):
    _hopper()
    B, Hq, Hkv, Nq, Nk, causal = case
    grads, lse = check_gradients(B, Hq, Hkv, Nq, Nk, D, causal, dtype)
    empty = torch.isinf(lse)                      # rows with no key: exactly zero dq
    if empty.any():
        assert (grads[0][empty] == 0).all()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", list(fa3_bwd.VARIANTS))
def test_gpu_every_variant(variant, dtype):
    _hopper()
    for D in fa3_bwd.VARIANTS[variant].head_dims:
        for causal in (False, True):
            check_gradients(2, 4, 2, 1000, 1531, D, causal, dtype, variant)
        check_gradients(1, 3, 3, 300, 130, D, True, dtype, variant)


def per_head_slopes(B, Hq):
    """ALiBi slopes per (batch, query head): Press et al.'s 2^(-8 h / Hq), times 0.5 to 1.5 over
    the batch."""
    heads = 2.0 ** (-8.0 * torch.arange(1, Hq + 1) / Hq)
    return (heads * torch.linspace(0.5, 1.5, B)[:, None]).to(DEV)


SCORE_MODS = {
    "softcap": lambda B, Hq: dict(softcap=3.0),           # a small cap: most scores bend
    "alibi": lambda B, Hq: dict(alibi_slopes=per_head_slopes(B, Hq)),
    "softcap_alibi": lambda B, Hq: dict(softcap=20.0, alibi_slopes=per_head_slopes(B, Hq)),
}


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", fa3_bwd.HEAD_DIMS)
@pytest.mark.parametrize("mod", SCORE_MODS)
def test_gpu_score_modifiers(mod, D, dtype):
    """The score-modifier hook in the backward (the softcap's derivative in dS, ALiBi's positions
    in both tile orientations): ragged, grouped heads, causal with Nq > Nk (rows with no key get
    zero dq), scores past tanh's bend, against the oracle with the same modifier."""
    _hopper()
    for B, Hq, Hkv, Nq, Nk, causal in [(2, 6, 2, 1000, 1531, False), (2, 6, 2, 1000, 1531, True),
                                       (1, 4, 4, 777, 500, True), (1, 2, 1, 77, 77, True)]:
        grads, lse = check_gradients(B, Hq, Hkv, Nq, Nk, D, causal, dtype, **SCORE_MODS[mod](B, Hq))
        empty = torch.isinf(lse)
        assert empty.any() == (Nq > Nk and causal)
        assert (grads[0][empty] == 0).all()
    check_gradients(1, 4, 2, 513, 1041, D, True, dtype, q_scale=5.0, **SCORE_MODS[mod](1, 4))
    for variant, v in fa3_bwd.VARIANTS.items():   # every tile layout (keys or rows along M)
        if D in v.head_dims:
            check_gradients(1, 3, 3, 300, 130, D, True, dtype, variant, **SCORE_MODS[mod](1, 3))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_large_logits_and_strided_views(causal):
    _hopper()
    for D in fa3_bwd.HEAD_DIMS:
        check_gradients(1, 4, 2, 513, 1041, D, causal, torch.float16, q_scale=20.0)
        check_gradients(2, 4, 2, 333, 517, D, causal, torch.bfloat16, strided=True)


@gpu
@pytest.mark.gpu
def test_gpu_real_size_matches_fa2_backward():
    """At a real size (the ring wraps many times, 4 query heads per K/V head) against the portable
    backward on the same inputs (the oracle in float64 would need too much memory)."""
    _hopper()
    from flashlib.kernels.fa2_bwd import fa2_backward
    from flashlib.kernels.fa2_fwd import fa2_forward
    for D in fa3_bwd.HEAD_DIMS:
        for causal in (False, True):
            q = torch.randn(2, 16, 4097, D, dtype=torch.float16, device=DEV)
            k, v = (torch.randn(2, 4, 4097, D, dtype=torch.float16, device=DEV) for _ in range(2))
            dout = torch.randn_like(q)
            out, lse = fa2_forward(q, k, v, causal=causal)
            got = fa3_bwd.fa3_backward(q, k, v, out, lse, dout, causal=causal)
            want = fa2_backward(q, k, v, out, lse, dout, causal=causal)
            for name, g, w in zip(("dq", "dk", "dv"), got, want):
                assert torch.isfinite(g).all(), name
                err = (g.float() - w.float()).abs().max().item()
                assert err <= 2e-2 * max(1.0, w.float().abs().max().item()), (name, D, causal, err)


PACKED_LENGTHS = ([1, 700, 0, 129, 64, 1000, 3, 65],    # queries: 1-token, empty, ragged blocks
                  [5, 700, 3, 0, 300, 1000, 1, 200])    # keys: Nq != Nk, none, causal Nq > Nk


def check_packed(lengths_q, lengths_k, Hq, Hkv, D, causal, dtype, variant=None, seed=0, **score_mods):
    """fa3_backward on packed sequences, (out, lse) from fa2_forward's packed path, against float64
    autograd through the oracle on each sequence's (1, H, n, D) views, as test_varlen.check does.
    Keys of a sequence without queries and queries of one without keys get exactly zero
    gradients. score_mods: ``softcap``, ``alibi_slopes`` (B, Hq): one row per sequence."""
    from flashlib.kernels.fa2_fwd import fa2_forward
    from test_varlen import packed
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, Hq, Hkv, D, dtype, seed)
    dout = torch.randn_like(q)
    mod = score_mod.make(q, score_mod.Modifiers(**score_mods), batch=len(lengths_q))
    cu_seqlens, max_seqlen = (cu_q, cu_k), (max(lengths_q), max(lengths_k))
    out, lse = fa2_forward(q, k, v, causal=causal, score_mod=mod, cu_seqlens=cu_seqlens,
                           max_seqlen=max_seqlen)
    assert fa3_bwd.supported(q, k, v, out, lse, dout, packed=True)
    grads = fa3_bwd.fa3_backward(q, k, v, out, lse, dout, causal=causal, variant=variant, score_mod=mod,
                                 cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    for name, g, t in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        assert g.shape == t.shape and g.dtype == dtype, name
        assert torch.isfinite(g).all(), f"{name} has NaN or inf entries"
    slopes = score_mods.get("alibi_slopes")
    as4 = lambda t: t.transpose(0, 1).unsqueeze(0)                         # noqa: E731  (1, H, n, D)
    for b in range(len(lengths_q)):
        rq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        rk = slice(int(cu_k[b]), int(cu_k[b + 1]))
        name = f"sequence {b} ({lengths_q[b]} queries, {lengths_k[b]} keys)"
        if lengths_q[b] == 0 or lengths_k[b] == 0:
            for gname, g, rows in zip(("dq", "dk", "dv"), grads, (rq, rk, rk)):
                assert (g[rows] == 0).all(), f"{gname} of {name}"
            continue
        seq = [as4(t[r]) for t, r in ((q, rq), (k, rk), (v, rk))]
        seq_mods = dict(score_mods, **({} if slopes is None else {"alibi_slopes": slopes[b]}))
        sdout = as4(dout[rq])
        ref_leaves = [t.double().requires_grad_() for t in seq]
        ref, _ = attention_ref(*ref_leaves, causal=causal, **seq_mods)
        ref_grads = torch.autograd.grad(ref, ref_leaves, sdout.double())
        base_leaves = [t.clone().requires_grad_() for t in seq]
        base_grads = torch.autograd.grad(attention_naive(*base_leaves, causal=causal, **seq_mods),
                                         base_leaves, sdout)
        mags = testing.attention_magnitudes(*seq, sdout, causal=causal, **seq_mods)
        for gname, g, r, bg, rows in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads, (rq, rk, rk)):
            testing.assert_close(as4(g[rows]), r, baseline=bg, dtype=dtype, name=f"{gname} of {name}",
                                 magnitude=mags[gname])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", fa3_bwd.HEAD_DIMS)
def test_gpu_packed_sequences(D, dtype, monkeypatch):
    """fa3_backward on packed sequences (cu_seqlens, flash-attn's varlen layout): ragged lengths
    with empty and 1-token sequences, Nq != Nk in each, causal rows that see no key, sequences
    ending mid-block (the next one's rows in the same query and key blocks), grouped heads 4:1,
    the softcap with per-sequence ALiBi; a second call of each layout on fresh tensors replays the
    first's plan; no rows at all; in float16 the other variants too."""
    _hopper()
    from flashlib.kernels import launch
    replays, real_replay = [], fa3_bwd._replay
    monkeypatch.setattr(fa3_bwd, "_replay", lambda *a: replays.append(1) or real_replay(*a))
    lengths_q, lengths_k = PACKED_LENGTHS
    slopes = torch.linspace(0.05, 1.0, 64, device=DEV).reshape(8, 8)      # (B, Hq)
    for mods in (dict(causal=False), dict(causal=True),
                 dict(causal=True, softcap=20.0, alibi_slopes=slopes)):
        for seed in (0, 1):
            replayed = len(replays)
            check_packed(lengths_q, lengths_k, 8, 2, D, dtype=dtype, seed=seed, **mods)
        assert len(replays) == replayed + launch.enabled(runtime.OPTIONS), "the second call did not replay the plan"
    for lq, lk in (([0, 0], [3, 70]), ([5, 2], [0, 0])):                 # no queries, no keys
        check_packed(lq, lk, 8, 2, D, causal=True, dtype=dtype)
    if dtype == torch.float16:
        for variant, v in fa3_bwd.VARIANTS.items():
            if D in v.head_dims and variant != fa3_bwd.DEFAULT_VARIANT[D]:
                check_packed(lengths_q, lengths_k, 8, 2, D, causal=True, dtype=dtype, variant=variant)
