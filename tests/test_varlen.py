"""flash_attention_varlen: packed sequences of different lengths, against the float64 oracle.

Each sequence of a packed batch is checked on its own against ``attention_ref`` over its rows
(bottom-right causal within it), forward and backward, with flashlib.testing's rule: empty and
one-token sequences, more queries than keys and the reverse, grouped heads, head dim 80, the
score modifiers with per-sequence ALiBi slopes. Also: the packed kernels give what the dense ones
give on the same sequences, and bad offsets are a clear error. GPU tests (marked ``gpu``) at real
sizes.
"""
import pytest
import torch

from flashlib import flash_attention, flash_attention_varlen, runtime
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import assert_close, attention_magnitudes, lse_method_error
from test_flash_attention import hopper_kernels, skip_without_hopper, spy_on_version  # noqa: F401 (a fixture)

DEV = runtime.DEVICE
gpu = pytest.mark.skipif(DEV.type != "cuda", reason="needs a CUDA GPU")


def packed(lengths_q, lengths_k, Hq, Hkv, D, dtype, seed=0):
    """Random packed q, k, v and their int32 offsets."""
    g = torch.Generator(DEV).manual_seed(seed)
    q = torch.randn(sum(lengths_q), Hq, D, dtype=dtype, device=DEV, generator=g)
    k, v = (torch.randn(sum(lengths_k), Hkv, D, dtype=dtype, device=DEV, generator=g) for _ in range(2))
    offsets = lambda n: torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32,  # noqa: E731
                                     device=DEV)
    return q, k, v, offsets(lengths_q), offsets(lengths_k)


def check(lengths_q, lengths_k, Hq, Hkv, D, *, causal, dtype=torch.float32, seed=0, **mods):
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, Hq, Hkv, D, dtype, seed)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flash_attention_varlen(*leaves, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                      causal=causal, return_lse=True, **mods)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (Hq, q.shape[0])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    slopes = mods.get("alibi_slopes")
    for b in range(len(lengths_q)):
        rq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        rk = slice(int(cu_k[b]), int(cu_k[b + 1]))
        as4 = lambda t: t.transpose(0, 1).unsqueeze(0)                     # noqa: E731  (1, H, n, D)
        seq = [as4(t[r]) for t, r in ((q, rq), (k, rk), (v, rk))]
        seq_mods = dict(mods, **({"alibi_slopes": slopes[b] if slopes.ndim == 2 else slopes}
                                 if slopes is not None else {}))
        ref_leaves = [t.double().requires_grad_() for t in seq]
        ref, ref_lse = attention_ref(*ref_leaves, causal=causal, **seq_mods)
        base_leaves = [t.clone().requires_grad_() for t in seq]
        base = attention_naive(*base_leaves, causal=causal, **seq_mods)
        sdout = as4(dout[rq])
        mags = attention_magnitudes(*seq, sdout, causal=causal, **seq_mods)
        name = f"sequence {b} ({lengths_q[b]} queries, {lengths_k[b]} keys)"
        assert_close(as4(out[rq]), ref, baseline=base, dtype=dtype, name=f"out of {name}",
                     magnitude=mags["out"])
        assert torch.equal(torch.isinf(lse[:, rq]).cpu(), torch.isinf(ref_lse[0]).cpu()), name
        assert_close(lse[:, rq], ref_lse[0], baseline=ref_lse[0].float(), dtype=torch.float32,
                     name=f"lse of {name}", magnitude=mags["lse"],
                     method_error=lse_method_error(q, mods.get("softcap")))
        if lengths_q[b] == 0:
            continue
        ref_grads = torch.autograd.grad(ref, ref_leaves, sdout.double(), allow_unused=True)
        base_grads = torch.autograd.grad(base, base_leaves, sdout, allow_unused=True)
        for gname, g, r, bg, rows in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads, (rq, rk, rk)):
            zero = lambda t: torch.zeros_like(seq[0 if gname == "dq" else 1]) if t is None else t  # noqa: E731
            assert_close(as4(g[rows]), zero(r), baseline=zero(bg), dtype=dtype,
                         name=f"{gname} of {name}", magnitude=mags[gname])


@pytest.mark.parametrize("causal", [False, True])
def test_ragged_batch_with_empty_and_single_token_sequences(causal):
    check([5, 0, 1, 37, 20], [9, 4, 1, 37, 3], 4, 2, 24, causal=causal)


def test_head_dim_80_float16_more_keys_than_queries():
    check([3, 70, 18], [40, 70, 64], 6, 3, 80, causal=True, dtype=torch.float16)


def test_score_modifiers_per_sequence():
    slopes = torch.rand(3, 4, device=DEV)
    check([12, 30, 7], [12, 25, 16], 4, 2, 16, causal=True, softcap=3.0, alibi_slopes=slopes)


def test_equals_the_dense_kernel_on_equal_lengths():
    # four sequences of 33: the packed kernels give what the dense ones give, bit for bit
    q, k, v, cu_q, cu_k = packed([33] * 4, [33] * 4, 4, 2, 16, torch.float32)
    out = flash_attention_varlen(q, k, v, cu_q, cu_k, 33, 33, causal=True)
    dense = flash_attention(*(t.reshape(4, 33, *t.shape[1:]).transpose(1, 2) for t in (q, k, v)),
                            causal=True)
    assert torch.equal(out, dense.transpose(1, 2).reshape(q.shape))


def test_a_larger_max_seqlen_changes_nothing():
    q, k, v, cu_q, cu_k = packed([10, 20], [15, 5], 2, 2, 16, torch.float32)
    exact = flash_attention_varlen(q, k, v, cu_q, cu_k, 20, 15)
    roomy = flash_attention_varlen(q, k, v, cu_q, cu_k, 200, 150)
    assert torch.equal(exact, roomy)


def _offsets(values):
    return torch.tensor(values, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("change, error, match", [
    (dict(cu_seqlens_q=_offsets([0, 9, 4, 30])), ValueError, "cu_seqlens_q must start at 0, never decrease"),
    (dict(cu_seqlens_k=_offsets([0, 5, 10, 29])), ValueError, "end at 30"),
    (dict(cu_seqlens_k=_offsets([1, 5, 10, 30])), ValueError, "start at 0"),
    (dict(cu_seqlens_q=_offsets([0, 10, 20, 30]).long()), TypeError, "cu_seqlens_q must be an int32"),
    (dict(cu_seqlens_k=_offsets([0, 30])), ValueError, "describe 3 and 1 sequences"),
    (dict(max_seqlen_q=9), ValueError, "max_seqlen_q=9 is less than the longest sequence"),
    (dict(max_seqlen_k=2.5), TypeError, "max_seqlen_k must be an int"),
    (dict(q=torch.zeros(2, 30, 2, 16)), ValueError, "q must have 3 dims"),
])
def test_bad_offsets_name_the_argument(change, error, match):
    q, k, v, cu_q, cu_k = packed([10, 10, 10], [10, 10, 10], 2, 2, 16, torch.float32)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=10, max_seqlen_k=10)
    args.update({name: value.to(DEV) if isinstance(value, torch.Tensor) else value
                 for name, value in change.items()})
    with pytest.raises(error, match=match):
        flash_attention_varlen(**args)


def test_offsets_are_read_once_per_version(monkeypatch):
    """Reading the offsets is a device sync: a model passes the same tensor to every layer, so it
    is read once, and again after any in-place change (its version counter moves)."""
    q, k, v, cu_q, cu_k = packed([10, 10, 10], [10, 10, 10], 2, 2, 16, torch.float32)
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or tolist(t))
    first = flash_attention_varlen(q, k, v, cu_q, cu_k, 10, 10)
    assert len(reads) == 2                                    # cu_seqlens_q and cu_seqlens_k
    assert torch.equal(flash_attention_varlen(q, k, v, cu_q, cu_k, 10, 10), first)
    assert len(reads) == 2
    cu_q[1] = 25                                              # in place: read and checked again
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0, never decrease"):
        flash_attention_varlen(q, k, v, cu_q, cu_k, 25, 10)
    assert len(reads) == 3


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_real_sizes(dtype):
    lengths = [1, 2047, 4096, 300, 0, 1500, 3333]
    check(lengths, lengths, 16, 4, 128, causal=True, dtype=dtype)
    check([512, 3000, 77], [4096, 3000, 1000], 8, 8, 64, causal=False, dtype=dtype, softcap=30.0)


def test_packed_calls_go_to_the_hopper_kernels_where_they_run(monkeypatch):
    # on an sm90 GPU (stood in for here: the FA3 kernels' supported and launchers replaced by
    # recorders that run FA2's) a large packed call runs FA3's forward and backward with the
    # offsets; small ones and FA3 turned off FA2's
    from flashlib.kernels import fa2_bwd, fa2_fwd, fa3_bwd, fa3_fwd
    calls = []
    monkeypatch.setattr(fa3_fwd, "supported", lambda q, k, v, packed=False: packed and q.ndim == 3)
    monkeypatch.setattr(fa3_bwd, "supported", lambda q, k, v, out, lse, dout, packed=False: packed and q.ndim == 3)
    spy_on_version(monkeypatch, 3, lambda a, kw: calls.append(("fa3", kw["max_seqlen"]))
                   or fa2_fwd.fa2_forward(*a, **kw))
    spy_on_version(monkeypatch, 3, lambda a, kw: calls.append(("fa3 bwd", kw["max_seqlen"]))
                   or fa2_bwd.fa2_backward(*a, **kw), backward=True)
    spy_on_version(monkeypatch, 2, lambda a, kw: calls.append("fa2 bwd"), backward=True)
    lengths, fa3 = [5, 0, 17, 1], [("fa3", (17, 17)), ("fa3 bwd", (17, 17))]
    for D, causal, from_flops, expected in [(16, False, 0, fa3),
                                            (16, True, 4 * 23 * 4 * 17 * 16 // 2, fa3),
                                            (16, True, 4 * 23 * 4 * 17 * 16 // 2 + 1, ["fa2 bwd"]),
                                            (64, True, 0, [("fa3", (17, 17)), ("fa3 bwd", (17, 17))])]:
        calls.clear()
        with runtime.kernel_options(fa3=True, fa3_from_flops=from_flops):
            check(lengths, lengths, 4, 2, D, causal=causal)
        assert calls == expected, (D, causal, from_flops, calls)
    with runtime.kernel_options(fa3=False, fa3_from_flops=0):                # FA3 turned off
        calls.clear()
        check(lengths, lengths, 4, 2, 16, causal=False)
        assert calls == ["fa2 bwd"]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_hopper_kernels_packed(monkeypatch, hopper_kernels, dtype):
    """The FA3 kernels (kernels/fa3_fwd.py, fa3_bwd.py) on packed sequences through
    flash_attention_varlen: descriptors over (1, H, total, D) views, each sequence's rows from its
    offset, a sequence's last block stored row by row (TMA would write the next sequence's rows),
    the forward's programs numbered over the pack's blocks. Ragged lengths with empty and 1-token
    sequences, a last sequence ending mid-block, causal with Nq != Nk per sequence, grouped heads,
    both head dims, the modifiers; a second call of each layout replays the first's plan."""
    skip_without_hopper(dtype)
    calls = []
    spy_on_version(monkeypatch, 3, lambda a, kw: calls.append(kw["cu_seqlens"] is not None))
    lengths_q = [1, 700, 0, 129, 64, 1000, 3, 65]
    lengths_k = [5, 700, 3, 0, 300, 1000, 1, 200]
    slopes = torch.linspace(0.05, 1.0, 8, device=DEV)
    for D in (64, 128):
        for seed in (0, 1):
            check(lengths_q, lengths_k, 8, 2, D, causal=True, dtype=dtype, seed=seed)
        check(lengths_q, lengths_k, 8, 8, D, causal=False, dtype=dtype)
        check(lengths_q, lengths_k, 8, 2, D, causal=True, dtype=dtype, alibi_slopes=slopes)
        check(lengths_k, lengths_q, 8, 4, D, causal=True, dtype=dtype, softcap=30.0)
    # many short sequences: the grid numbers the pack's blocks (fa3_fwd._packed_block) over more
    # sequences than one program's lanes
    many = torch.randint(0, 200, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    check(many, many[::-1], 4, 2, 64, causal=True, dtype=dtype)
    assert len(calls) == 11 and all(calls)


def test_torch_compile_runs_the_same_kernels():
    # under torch.compile the packed call runs as two ops (flashlib::fa2_varlen_forward and
    # _backward, inside ops.OpAttention); the offsets are still checked on the host first (a graph
    # break before the op)
    from flashlib import ops
    q, k, v, cu_q, cu_k = packed([5, 0, 17, 1], [9, 3, 17, 20], 4, 2, 16, torch.float32)
    slopes = torch.rand(4, device=DEV)
    dout = torch.randn_like(q)

    def attend(q, k, v):
        return flash_attention_varlen(q, k, v, cu_q, cu_k, 17, 20, causal=True, return_lse=True,
                                      softcap=8.0, alibi_slopes=slopes)
    graphs = []

    def backend(gm, example_inputs):   # keeps what Dynamo traced (the Function's too), runs it as traced
        graphs.extend(str(m.graph) for m in gm.modules() if isinstance(m, torch.fx.GraphModule))
        return gm.forward
    results = []
    for fn in (torch.compile(attend, backend=backend), attend):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = fn(*leaves)
        results.append((out, lse, *torch.autograd.grad(out, leaves, dout)))
    for name, compiled, eager in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(compiled, eager), name
    assert any("flashlib.fa2_varlen_forward" in g for g in graphs), graphs
    from flashlib.kernels.score_mod import NO_MODIFIERS, Modifiers
    none, mods, options = NO_MODIFIERS.op_args(), Modifiers(8.0, slopes).op_args(), runtime.OPTIONS.op_args()
    out, lse = ops._varlen_forward_op(q, k, v, cu_q, cu_k, 17, 20, True, 0.25, *none, options)
    # the ops have no autograd of their own (OpAttention is theirs): schema and fake outputs
    torch.library.opcheck(ops._varlen_forward_op, (q, k, v, cu_q, cu_k, 17, 20, True, 0.25, *mods, options))
    torch.library.opcheck(ops._varlen_backward_op, (q, k, v, out, lse, torch.randn_like(out), cu_q, cu_k,
                                                    17, 20, True, 0.25, *none, options))
