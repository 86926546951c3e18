"""Ring attention (flashlib.distributed) against the float64 oracle on the whole sequence.

Each case spawns no process of its own: one group of 2, 3 or 4 gloo processes on the CPU runs a
list of cases (the kernels through Triton's interpreter), and every rank checks its own shard of
out, lse and the gradients of a global loss sum(out * g) against ``attention_ref`` on the full
sequence, with the one tolerance rule (baseline: naive attention in the same dtype). The 3-process
group also runs subgroups (ranks [1, 2], a ring whose ranks are not the global ones, and [0], a
ring of one). A ``gpu`` test does the same with NCCL on two GPUs at larger sizes.
"""
import datetime
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashlib import distributed as fd
from flashlib import runtime
from flashlib.ops import flash_attention
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import assert_close, attention_magnitudes

DEV = runtime.DEVICE


def case(Hq=4, Hkv=2, n=16, D=16, causal=True, layout="contiguous", dtype=torch.float32, B=1,
         scale=None, group=None):
    return dict(B=B, Hq=Hq, Hkv=Hkv, n=n, D=D, causal=causal, layout=layout, dtype=dtype,
                scale=scale, group=group)


CASES = {   # world size -> cases run in one group of that many gloo processes
    2: [case(causal=False, Hq=3, Hkv=3, n=17),            # odd shard, no grouped heads
        case(),                                           # grouped heads, causal
        case(layout="zigzag", n=18, D=24),                # zigzag, head dim not a power of two
        case(causal=False, layout="zigzag"),
        case(n=12, scale=40.0),                           # scores near +-1e3: the merge's max
        case(dtype=torch.float16, layout="zigzag", n=32),
        case(dtype=torch.bfloat16, n=16, Hkv=1)],
    3: [case(n=16, Hq=2, Hkv=1),
        case(layout="zigzag", causal=True, n=16),
        case(causal=False, n=16, B=2),
        case(causal=True, group=[1, 2]),                  # a subgroup: group ranks != global ranks
        case(causal=True, layout="zigzag", group=[0])],   # a ring of one: flash_attention
    4: [case(n=16, Hq=2, Hkv=2),
        case(layout="zigzag", n=16, Hq=2, Hkv=1),
        case(causal=False, n=16, Hq=2, Hkv=1)],
}


def full_inputs(c, world, device, seed):
    """The whole sequence's q, k, v and the loss weights g, the same on every rank."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, Hq, Hkv, N, D = c["B"], c["Hq"], c["Hkv"], c["n"] * world, c["D"]
    shapes = ((B, Hq, N, D), (B, Hkv, N, D), (B, Hkv, N, D), (B, Hq, N, D))
    return [torch.randn(s, generator=g).to(device, c["dtype"]) for s in shapes]


def check_case(c, rank, world, device, seed, group=None):
    """Run one case on this rank and check its shards; ``world`` is the ring's size."""
    q, k, v, g = full_inputs(c, world, device, seed)
    causal, scale, layout, dtype = c["causal"], c["scale"], c["layout"], c["dtype"]
    part = lambda t: fd.shard(t, rank, world, layout=layout)   # noqa: E731  this rank's shard
    leaves = [part(t).requires_grad_() for t in (q, k, v)]
    out, lse = fd.ring_attention(*leaves, group=group, causal=causal, scale=scale, return_lse=True,
                                 layout=layout)
    grads = torch.autograd.grad(out, leaves, part(g))          # d sum(out * g) / d own shards
    assert out.dtype == dtype and out.shape == leaves[0].shape and lse.dtype == torch.float32

    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = attention_ref(*ref_leaves, causal=causal, scale=scale)
    ref_grads = torch.autograd.grad(ref, ref_leaves, g.double())
    base_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    base = attention_naive(*base_leaves, causal=causal, scale=scale)
    base_grads = torch.autograd.grad(base, base_leaves, g)
    mags = attention_magnitudes(q, k, v, g, causal=causal, scale=scale)
    tag = f"rank {rank}/{world} {c}"
    assert_close(out, part(ref), baseline=part(base), dtype=dtype, name=f"out, {tag}",
                 magnitude=mags["out"])
    assert torch.isfinite(lse).all(), f"lse, {tag}: not finite"
    assert_close(lse, part(ref_lse), baseline=part(ref_lse).float(), dtype=torch.float32,
                 name=f"lse, {tag}", magnitude=mags["lse"])
    for name, got, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert got.dtype == dtype and got.shape == leaves[("dq", "dk", "dv").index(name)].shape
        assert_close(got, part(r), baseline=part(b), dtype=dtype, name=f"{name}, {tag}",
                     magnitude=mags[name])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, backend, cases):
    """One process of the group: run every case (each rank the same list, in the same order)."""
    torch.set_num_threads(1)                       # 2 to 4 processes share CI's 2 cores
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        for i, c in enumerate(cases):
            members = c["group"] or list(range(world))
            sub = dist.new_group(members) if c["group"] else None   # every rank must create it
            if rank in members:
                check_case(c, members.index(rank), len(members), device, seed=1000 * world + i,
                           group=sub)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(world, cases, backend="gloo"):
    """Run ``cases`` in ``world`` new processes; with gloo their kernels go through Triton's
    interpreter even on a GPU machine (gloo sends CPU tensors)."""
    saved = os.environ.get("TRITON_INTERPRET")
    if backend == "gloo":
        os.environ["TRITON_INTERPRET"] = "1"    # read by the children's `import flashlib`
    try:
        mp.spawn(worker, args=(world, free_port(), backend, cases), nprocs=world, join=True)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


@pytest.mark.parametrize("world", sorted(CASES))
def test_ring_attention_matches_the_oracle_forward_and_backward(world):
    spawn(world, CASES[world])


@pytest.mark.gpu
def test_nccl_on_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    cases = [case(Hq=8, Hkv=2, n=n, D=D, causal=causal, layout=layout, dtype=dtype)
             for n, D, causal, layout, dtype in [
                 (1024, 128, True, "contiguous", torch.float16),
                 (1024, 128, True, "zigzag", torch.bfloat16),
                 (777, 80, False, "contiguous", torch.float16),
                 (2048, 64, True, "zigzag", torch.float32)]]
    spawn(2, cases, backend="nccl")


@pytest.mark.skipif(DEV.type == "cuda", reason="--smoke is the CPU's gloo run")
def test_smoke_benchmark_runs_on_cpu(tmp_path, group_of_one):
    """``python -m flashlib.bench.ring --smoke``'s worker (check, timings, JSON, log) at tiny sizes
    in a ring of this one process: the gloo groups above cover rings of several."""
    from flashlib.bench import ring as ring_bench
    args, _ = ring_bench.parse_args(["--smoke", "--out", str(tmp_path)])
    ring_bench.main_worker(args)
    import json
    data = json.loads(next(tmp_path.glob("ring_*.json")).read_text())
    assert data["records"] and all(r["ms"] > 0 for r in data["records"])
    assert {"ring_contiguous", "ring_zigzag", "flashlib"} <= {r["impl"] for r in data["records"]}
    assert next(tmp_path.glob("ring_*.log")).read_text().strip()


# ---- the pieces, in this process ----

def test_merge_is_exact_for_empty_parts_and_large_logits():
    out = torch.randn(2, 3, 5, 8)
    lse = torch.randn(2, 3, 5) * 1e4                    # exp(1e4) overflows: the merge must not
    empty_out, empty_lse = torch.zeros_like(out), torch.full_like(lse, float("-inf"))
    for merged in (fd.merge(out, lse, empty_out, empty_lse),
                   fd.merge(empty_out, empty_lse, out, lse)):
        assert torch.equal(merged[0], out) and torch.equal(merged[1], lse)
    both = fd.merge(empty_out, empty_lse, empty_out, empty_lse)
    assert torch.equal(both[0], empty_out) and torch.equal(both[1], empty_lse)   # 0 and -inf, no NaN
    other, mid = torch.randn(2, 3, 5, 8), 500 + torch.randn(2, 3, 5)   # exp(500) overflows too
    m_out, m_lse = fd.merge(out, mid, other, mid)       # equal weights: the mean, lse + log 2
    assert torch.allclose(m_out, (out + other) / 2, atol=2e-4)   # lse's ulp at 500: 3e-5
    assert torch.allclose(m_lse, mid + torch.log(torch.tensor(2.0)), rtol=1e-6)


def test_merge_of_two_key_halves_is_attention_over_all_keys():
    q, k, v = torch.randn(1, 2, 7, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    a = attention_ref(q, k[:, :, :5], v[:, :, :5])
    b = attention_ref(q, k[:, :, 5:], v[:, :, 5:])
    out, lse = fd.merge(*a, *b)
    ref, ref_lse = attention_ref(q, k, v)
    assert torch.allclose(out.double(), ref, atol=1e-6) and torch.allclose(lse.double(), ref_lse, atol=1e-5)


@pytest.mark.parametrize("layout", fd.LAYOUTS)
@pytest.mark.parametrize("world", [1, 3, 4])
def test_shard_and_unshard_are_inverse_and_zigzag_balances(layout, world):
    x = torch.randn(2, 3, 8 * world, 5)
    shards = [fd.shard(x, r, world, layout=layout) for r in range(world)]
    assert torch.equal(fd.unshard(shards, layout=layout), x)
    got = torch.cat([fd.positions(8 * world, r, world, layout=layout) for r in range(world)])
    assert sorted(got.tolist()) == list(range(8 * world))
    if layout == "zigzag":   # rank r: chunks r and 2W-1-r, so every rank sees the same causal work
        assert fd.positions(8 * world, 0, world, layout=layout).tolist() == \
            list(range(4)) + list(range(8 * world - 4, 8 * world))
        work = [int((fd.positions(8 * world, r, world, layout=layout) + 1).sum()) for r in range(world)]
        assert len(set(work)) == 1


def test_shard_errors_name_the_argument():
    x = torch.randn(1, 1, 10, 4)
    with pytest.raises(ValueError, match="seqlen=10 does not split into 4"):
        fd.shard(x, 0, 2, layout="zigzag")
    with pytest.raises(ValueError, match="rank"):
        fd.shard(x, 2, 2)
    with pytest.raises(ValueError, match="layout"):
        fd.shard(x, 0, 2, layout="striped")
    with pytest.raises(TypeError, match="world"):
        fd.shard(x, 0, 2.0)
    with pytest.raises(ValueError, match="shards"):
        fd.unshard([])


def test_without_an_initialised_group_the_error_says_what_to_call():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="init_process_group"):
        fd.ring_attention(q, q, q)


@pytest.fixture
def group_of_one():
    """A group of this one process (its ring moves nothing), destroyed afterwards."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    backend = "nccl" if runtime.DEVICE.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_a_ring_of_one_is_flash_attention(group_of_one):
    q, k, v = (torch.randn(1, h, 20, 16, device=DEV) for h in (4, 2, 2))
    out, lse = fd.ring_attention(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_bad_inputs_get_errors_naming_the_argument(group_of_one):
    q, k = torch.randn(1, 4, 8, 16, device=DEV), torch.randn(1, 2, 8, 16, device=DEV)
    with pytest.raises(ValueError, match="q has 8 positions but k and v have 6"):
        fd.ring_attention(q, k[:, :, :6], k[:, :, :6])
    with pytest.raises(ValueError, match="heads_q=4 is not a multiple of heads_kv=3"):
        fd.ring_attention(q, k.repeat(1, 2, 1, 1)[:, :3], k.repeat(1, 2, 1, 1)[:, :3])
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        fd.ring_attention(q, k, k[:, :1])
    with pytest.raises(ValueError, match="even shard length"):
        fd.ring_attention(q[:, :, :7], k[:, :, :7], k[:, :, :7], layout="zigzag")
    with pytest.raises(ValueError, match="layout"):
        fd.ring_attention(q, k, k, layout="ring")
    with pytest.raises(TypeError, match="group must be"):
        fd.ring_attention(q, k, k, group="world")
    with pytest.raises(TypeError, match="q has dtype torch.int64"):
        fd.ring_attention(q.long(), k, k)
    with pytest.raises(TypeError, match="causal"):
        fd.ring_attention(q, k, k, causal=1)
    with pytest.raises(ValueError, match="the group's backend is"):
        fd.Ring().check_device(torch.empty(1, device="meta"))   # neither gloo's nor nccl's
