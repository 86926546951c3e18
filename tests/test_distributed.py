"""Ring attention (flashlib.distributed) against the float64 oracle on the whole sequence.

Each case spawns no process of its own: one group of 2, 3 or 4 gloo processes on the CPU runs a
list of cases (the kernels through Triton's interpreter), and every rank checks its own shard of
out, lse and the gradients of a global loss sum(out * g) against ``attention_ref`` on the full
sequence, with the one tolerance rule (baseline: naive attention in the same dtype). The 3-process
group also runs subgroups (ranks [1, 2], a ring whose ranks are not the global ones, and [0], a
ring of one). A ``gpu`` test does the same with NCCL on 2 and on 4 GPUs.

The ring's steps (``step_forward``, ``step_backward``, in ``schedule``'s order) are also run for
every rank in this one process, without a process group (``simulate``): on the CPU at small
irregular shapes, and in a ``gpu`` test on one GPU at a real size, where every block must run on
the kernel version ``flash_attention`` picks (FA3's on Hopper).
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
         scale=None, group=None, kernel_options=None):
    return dict(B=B, Hq=Hq, Hkv=Hkv, n=n, D=D, causal=causal, layout=layout, dtype=dtype,
                scale=scale, group=group, kernel_options=kernel_options)


NO_THRESHOLD = {"fa3_from_flops": 0}   # FA3 takes every block it can run, however small


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
    causal, scale, layout = c["causal"], c["scale"], c["layout"]
    part = lambda t: fd.shard(t, rank, world, layout=layout)   # noqa: E731  this rank's shard
    leaves = [part(t).requires_grad_() for t in (q, k, v)]
    fd.warm_up(*leaves, group=group, causal=causal, scale=scale, layout=layout,
               kernel_options=c["kernel_options"])
    out, lse = fd.ring_attention(*leaves, group=group, causal=causal, scale=scale, return_lse=True,
                                 layout=layout, kernel_options=c["kernel_options"])
    grads = torch.autograd.grad(out, leaves, part(g))          # d sum(out * g) / d own shards
    for got, leaf in zip((out, *grads), (leaves[0], *leaves)):
        assert got.dtype == leaf.dtype and got.shape == leaf.shape
    assert_matches_oracle((out, lse, *grads), q, k, v, g, causal=causal, scale=scale, select=part,
                          tag=f"rank {rank}/{world} {c}")


def assert_matches_oracle(got, q, k, v, g, *, causal, scale, select=lambda t: t, tag=""):
    """got: (out, lse, dq, dk, dv) of the positions ``select`` takes from the whole sequence's,
    checked against ``attention_ref`` on the whole sequence (float64; the gradients of sum(out * g))
    with the one tolerance rule, the baseline naive attention in q's dtype."""
    dtype = q.dtype
    out, lse, *grads = got
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = attention_ref(*ref_leaves, causal=causal, scale=scale)
    ref_grads = torch.autograd.grad(ref, ref_leaves, g.double())
    base_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    base = attention_naive(*base_leaves, causal=causal, scale=scale)
    base_grads = torch.autograd.grad(base, base_leaves, g)
    mags = attention_magnitudes(q, k, v, g, causal=causal, scale=scale)
    assert_close(out, select(ref), baseline=select(base), dtype=dtype, name=f"out, {tag}",
                 magnitude=mags["out"])
    assert torch.isfinite(lse).all(), f"lse, {tag}: not finite"
    assert_close(lse, select(ref_lse), baseline=select(ref_lse).float(), dtype=torch.float32,
                 name=f"lse, {tag}", magnitude=mags["lse"])
    for name, got_grad, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert got_grad.dtype == dtype
        assert_close(got_grad, select(r), baseline=select(b), dtype=dtype, name=f"{name}, {tag}",
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
@pytest.mark.parametrize("world", [2, 4])
def test_nccl(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs")
    cases = [case(Hq=8, Hkv=2, n=n, D=D, causal=causal, layout=layout, dtype=dtype, kernel_options=opts)
             for n, D, causal, layout, dtype, opts in [
                 (1024, 128, True, "contiguous", torch.float16, None),
                 (1024, 128, True, "zigzag", torch.bfloat16, None),
                 (777, 80, False, "contiguous", torch.float16, None),
                 (2048, 64, True, "zigzag", torch.float32, None),
                 (1000, 64, True, "zigzag", torch.bfloat16, NO_THRESHOLD),   # FA3 on Hopper
                 (999, 128, False, "contiguous", torch.float16, NO_THRESHOLD)]]
    spawn(world, cases, backend="nccl")


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


def test_bench_refuses_lengths_zigzag_cannot_split(capsys, monkeypatch):
    """--seqlens must split into 2W equal chunks; --smoke sizes itself for any --nproc."""
    from flashlib.bench import ring as ring_bench
    monkeypatch.delenv("WORLD_SIZE", raising=False)      # not under torchrun: W is --nproc
    with pytest.raises(SystemExit):
        ring_bench.parse_args(["--nproc", "2", "--seqlens", "70"])
    assert "--seqlens 70: every length must split into 2 x 2 equal chunks" in capsys.readouterr().err
    args, _ = ring_bench.parse_args(["--smoke", "--nproc", "3"])
    assert args.seqlens == [96] and args.check_seqlen == 96


# ---- the pieces, in this process ----

def simulate(q, k, v, dout, world, *, causal, layout, scale=None, kernel_options=None):
    """The ring's steps for every rank of a ring of ``world``, one rank after another in this
    process: each rank's ``step_forward`` over its ``schedule`` (step t holds rank (r - t) mod W's
    block), then ``step_backward`` from its global out and lse, each block's dK/dV added in
    float32 to that block's accumulators as they travel. Returns the whole sequence's
    (out, lse, dq, dk, dv)."""
    options = runtime.options(kernel_options)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    n = q.shape[2] // world
    shards = lambda t: [fd.shard(t, r, world, layout=layout) for r in range(world)]  # noqa: E731
    qs, dos = shards(q), shards(dout)
    kvs = [torch.stack(pair) for pair in zip(shards(k), shards(v))]       # (2, B, Hkv, n, D) each
    steps = [fd.schedule(r, world, n, causal=causal, layout=layout) for r in range(world)]
    outs, lses = [], []
    for r in range(world):
        state = None
        for t, part in enumerate(steps[r]):
            if part is not None:
                state = fd.step_forward(qs[r], kvs[(r - t) % world], part, state, scale=scale,
                                        options=options)
        outs.append(state[0].to(q.dtype))
        lses.append(state[1])
    dqs = [torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in qs]
    dkvs = [torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in kvs]
    for r in range(world):
        for t, part in enumerate(steps[r]):
            if part is not None:
                src = (r - t) % world
                dq, dk, dv = fd.step_backward(qs[r], kvs[src], outs[r], lses[r], dos[r], part,
                                              scale=scale, options=options)
                rows, cols, _ = part
                dqs[r][:, :, rows] += dq
                dkvs[src][0][:, :, cols] += dk
                dkvs[src][1][:, :, cols] += dv
    whole = lambda parts, dtype=None: fd.unshard(parts, layout=layout).to(dtype or parts[0].dtype)  # noqa: E731
    return (whole(outs), whole(lses), whole(dqs, q.dtype), whole([d[0] for d in dkvs], k.dtype),
            whole([d[1] for d in dkvs], v.dtype))


@pytest.fixture
def versions_run(monkeypatch):
    """The numbers of the kernel versions the dispatcher runs, forward and backward, in order."""
    from flashlib.kernels import dispatch
    calls = []
    for number in dispatch.DISPATCH_ORDER:
        version = dispatch.VERSIONS[number]

        def spy(real, tag):
            def run(*args, **kwargs):
                calls.append(tag)
                return real(*args, **kwargs)
            return run
        monkeypatch.setitem(dispatch.VERSIONS, number, version._replace(
            forward=spy(version.forward, ("fwd", number)), backward=spy(version.backward, ("bwd", number))))
    return calls


def check_steps(B, Hq, Hkv, n, D, world, causal, layout, dtype, calls, *, version, kernel_options=None):
    """simulate() against the oracle; every block forward and backward on kernel ``version``."""
    g = torch.Generator(device="cpu").manual_seed(n * world + Hq)
    q, g_out = (torch.randn(B, Hq, n * world, D, generator=g).to(DEV, dtype) for _ in range(2))
    k, v = (torch.randn(B, Hkv, n * world, D, generator=g).to(DEV, dtype) for _ in range(2))
    got = simulate(q, k, v, g_out, world, causal=causal, layout=layout, kernel_options=kernel_options)
    assert_matches_oracle(got, q, k, v, g_out, causal=causal, scale=None,
                          tag=f"simulated ring of {world}, {layout}, causal={causal}, {dtype}")
    blocks = sum(part is not None for r in range(world)
                 for part in fd.schedule(r, world, n, causal=causal, layout=layout))
    assert calls == [("fwd", version)] * blocks + [("bwd", version)] * blocks


STEP_CASES = [  # (B, Hq, Hkv, n, D, world, causal, layout, dtype)
    (1, 4, 2, 17, 24, 2, True, "contiguous", torch.float32),    # odd shard, grouped heads
    (2, 3, 1, 18, 40, 3, True, "zigzag", torch.float32),        # zigzag halves of 9 rows
    (1, 2, 2, 10, 16, 2, False, "zigzag", torch.float16),
    (1, 9, 3, 9, 80, 4, True, "contiguous", torch.float32),     # head dim 80, 9 heads
]


@pytest.mark.skipif(DEV.type == "cuda", reason="the gpu test below runs the steps on the GPU")
@pytest.mark.parametrize("B, Hq, Hkv, n, D, world, causal, layout, dtype", STEP_CASES)
def test_the_ring_steps_through_the_dispatcher_match_the_oracle(B, Hq, Hkv, n, D, world, causal,
                                                                layout, dtype, versions_run):
    check_steps(B, Hq, Hkv, n, D, world, causal, layout, dtype, versions_run, version=2)


@pytest.mark.gpu
@pytest.mark.parametrize("B, Hq, Hkv, n, D, world, causal, layout, dtype, kernel_options, fa3", [
    # real sizes, default options: every block (whole, causal diagonal, zigzag halves) has at
    # least fa3_from_flops FLOPs, so on Hopper every one must run FA3's kernels
    (1, 16, 4, 4096, 128, 2, False, "contiguous", torch.float16, None, True),
    (1, 16, 4, 4096, 128, 2, True, "contiguous", torch.bfloat16, None, True),
    (1, 16, 16, 4096, 128, 2, True, "zigzag", torch.float16, None, True),
    # irregular shapes on FA3's kernels; float32 is FA2's on every GPU
    (2, 6, 2, 1000, 64, 3, True, "zigzag", torch.bfloat16, NO_THRESHOLD, True),
    (1, 4, 2, 777, 80, 2, True, "contiguous", torch.float32, None, False),
])
def test_the_ring_steps_on_one_gpu_run_flash_attentions_kernels(B, Hq, Hkv, n, D, world, causal, layout,
                                                                dtype, kernel_options, fa3, versions_run):
    if DEV.type != "cuda":
        pytest.skip("needs a CUDA GPU")
    hopper = runtime.capability(torch.device("cuda"))[0] == 9 and runtime.options(kernel_options).fa3
    check_steps(B, Hq, Hkv, n, D, world, causal, layout, dtype, versions_run,
                version=3 if fa3 and hopper else 2, kernel_options=kernel_options)


def test_warm_up_runs_the_rings_blocks_before_it(group_of_one, versions_run):
    q, k, v = (torch.randn(1, h, 20, 16, device=DEV) for h in (4, 2, 2))
    fd.warm_up(q, k, v, causal=True, layout="zigzag")
    assert versions_run == [("fwd", 2), ("bwd", 2)]           # a ring of one: the diagonal
    out = fd.ring_attention(q, k, v, causal=True, layout="zigzag")
    assert torch.equal(out, flash_attention(q, k, v, causal=True))

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
