"""Ring attention across GPUs: checked at a real size, then timed against one GPU.

    python -m flashlib.bench.ring --nproc 2 --out DIR                (spawns its own processes)
    torchrun --nproc_per_node=2 -m flashlib.bench.ring --out DIR
    python -m flashlib.bench.ring --smoke --out DIR                  (CPU, gloo, tiny: it runs)

1. Check: every rank's shard of ``ring_attention`` (out and the gradients of sum(out * g)) against
   ``flash_attention`` on the whole sequence in float32 (the stand-in for the float64 oracle at a
   size where float64 would take too long; float32 is never autotuned, ``kernels/config.py``),
   with the tolerance rule of ``flashlib.testing`` (baseline: ``flash_attention`` on one GPU in
   the same dtype), computed once for all layouts; each layout, causal and not.
2. Time, for each sequence length N and causal flag: one GPU (``flash_attention`` on the whole
   sequence, every rank at once on its own GPU) and the ring over W GPUs (each layout; zigzag only
   for causal, where it changes the work), forward and forward+backward; for the ring also the
   same steps without transfers (``Ring(transfer=False)``: compute only) and the transfers alone
   (comm only). The fraction of the transfers hidden behind compute is
   (compute + comm - ring) / comm, clipped to [0, 1]. Times are the slowest rank's mean of
   ``--reps`` runs after a warm-up run.

Default settings work as they are: before the ring runs at a new shape, ``distributed.warm_up``
compiles its kernels on rank 0 alone, then on the others, which read Triton's disk cache and
rank 0's autotuned configs (``kernels.config.SavedChoices``): every rank runs the configs picked once.
Rank 0 prints a progress line, with the seconds since the start, before each stage.

Records go to ``DIR/ring_<dtype>.json`` in the format of ``flashlib.bench.harness`` (env and
records; op "fwd" or "fwd_bwd", impl "flashlib" on one GPU, "ring_contiguous" and "ring_zigzag";
tflops are the whole attention's FLOPs over the time, so the ring's sum over its GPUs), with
extra keys world, layout, tokens_per_s, speedup_vs_1gpu, ms_compute_only, ms_comm_only and
comm_hidden; a text log ``ring_<dtype>.log`` and a plot ``ring_<dtype>.png`` go beside it.
"""
import argparse
import datetime
import json
import os
import pathlib
import socket
import time

import torch
import torch.distributed as dist

from .. import runtime
from . import harness
from ..distributed import Ring, RingAttention, ring_attention, shard, warm_up
from ..kernels.dispatch import attention_flops
from ..ops import flash_attention
from ..testing import max_error, tolerance

FLOPS_PER = {"fwd": 1.0, "fwd_bwd": 3.5}


def make_inputs(B, Hq, Hkv, N, D, dtype, device, seed=0):
    """The whole sequence's q, k, v and loss weights g, the same on every rank (same seed, same
    kind of device)."""
    g = torch.Generator(device=device).manual_seed(seed)
    shapes = ((B, Hq, N, D), (B, Hkv, N, D), (B, Hkv, N, D), (B, Hq, N, D))
    return [torch.randn(s, generator=g, device=device, dtype=dtype) for s in shapes]


def check(B, Hq, Hkv, N, D, dtype, device, *, causal, layouts, stage):
    """Per layout, the max error of this rank's out, dq, dk, dv over its tolerance (<= 1 passes),
    the worst over all ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, g = make_inputs(B, Hq, Hkv, N, D, dtype, device)

    def run(fn, tensors, weights):   # [out, dq, dk, dv]
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        out = fn(*leaves)
        return [out.detach(), *torch.autograd.grad(out, leaves, weights.to(out.dtype))]

    # the whole sequence on each GPU, once for every layout: float32 (the expected values) and
    # q's dtype (the baseline)
    stage(f"check N={N} Hq={Hq} causal={causal}: the whole sequence on each GPU, float32 and "
          f"{str(dtype).removeprefix('torch.')}")
    full = lambda *t: flash_attention(*t, causal=causal)     # noqa: E731
    expected = run(full, [t.float() for t in (q, k, v)], g)
    baseline = run(full, (q, k, v), g)
    results = {}
    for layout in layouts:
        part = lambda t: shard(t, rank, world, layout=layout)   # noqa: E731
        shards = [part(t) for t in (q, k, v)]
        stage(f"check N={N} causal={causal} {layout}: compiling the ring's kernels, rank 0 first")
        warm_up(*shards, causal=causal, layout=layout)
        stage(f"check N={N} causal={causal} {layout}: the ring, forward and backward")
        ring = run(lambda *t: ring_attention(*t, causal=causal, layout=layout), shards, part(g))
        ratios = torch.tensor([max_error(r, part(e)) / tolerance(part(e), part(b), dtype)
                               for r, e, b in zip(ring, expected, baseline)], device=device)
        dist.all_reduce(ratios, op=dist.ReduceOp.MAX)
        results[layout] = dict(zip(("out", "dq", "dk", "dv"), ratios.tolist()))
    return results


def timed(fn, *, reps, device):
    """(ms, peak GB): the slowest rank's mean time of ``fn`` after one warm-up call (compiles,
    tunes) and the largest rank's peak GPU memory (None on a CPU)."""
    cuda = device.type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if cuda:
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0
    worst = torch.tensor([(time.perf_counter() - start) * 1e3 / reps, peak], device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst[0].item(), (round(worst[1].item(), 3) if cuda else None)


def fwd_and_fwd_bwd(attend, q, k, v, dout):
    """(forward under no_grad, forward + backward) of ``attend(q, k, v) -> out``, as callables."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def fwd():
        with torch.no_grad():
            attend(q, k, v)

    def fwd_bwd():
        torch.autograd.grad(attend(*leaves), leaves, dout)
    return dict(fwd=fwd, fwd_bwd=fwd_bwd)


def transfers(k, v):
    """The ring's transfers alone: fwd sends K/V W-1 times; fwd_bwd also sends K/V W-1 times and
    the float32 dK/dV W times in the backward."""
    ring = Ring()
    kv = torch.stack((k, v))
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=k.device)

    def hops(t, count, tag=0):
        for _ in range(count):
            t = ring.start(t, tag)()

    def fwd():
        hops(kv, ring.world - 1)

    def fwd_bwd():
        hops(kv, 2 * (ring.world - 1))
        hops(dkv, ring.world, tag=1)
    return dict(fwd=fwd, fwd_bwd=fwd_bwd)


def record(op, impl, dtype, B, Hq, Hkv, N, D, causal, ms, peak, **extra):
    flops = attention_flops(B, Hq, N, N, D, causal=causal) * FLOPS_PER[op]
    return dict(op=op, impl=impl, dtype=str(dtype).replace("torch.", ""), B=B, Hq=Hq, Hkv=Hkv,
                Nq=N, Nk=N, D=D, causal=causal, density=1.0, ms=ms, tflops=flops / ms / 1e9,
                gbps=None, peak_mem_gb=peak, ratio_vs_sdpa_flash=None,
                tokens_per_s=B * N / ms * 1e3, **extra)


def bench_seqlen(N, causal, args, device, log, stage):
    """Records for one (N, causal): one GPU, then the ring in each layout."""
    rank, world = dist.get_rank(), dist.get_world_size()
    B, Hq, Hkv, D, dtype = args.batch, args.heads, args.heads_kv, args.headdim, args.dtype_t
    shape = (B, Hq, Hkv, N, D)
    q, k, v, dout = make_inputs(B, Hq, Hkv, N, D, dtype, device)
    records = []
    one = fwd_and_fwd_bwd(lambda *t: flash_attention(*t, causal=causal), q, k, v, dout)
    single = {}
    for op, fn in one.items():
        stage(f"N={N} causal={causal}: {op} on one GPU (each rank on its own)")
        single[op], peak = timed(fn, reps=args.reps, device=device)
        records.append(record(op, "flashlib", dtype, *shape, causal, single[op], peak, world=1,
                              layout=None, speedup_vs_1gpu=1.0))
        log(records[-1])
    del one
    scale, options = D ** -0.5, runtime.options()
    for layout in ("contiguous", "zigzag") if causal else ("contiguous",):
        qs, ks, vs, ds = (shard(t, rank, world, layout=layout).contiguous() for t in (q, k, v, dout))
        stage(f"N={N} causal={causal} {layout}: compiling the ring's kernels, rank 0 first")
        warm_up(qs, ks, vs, causal=causal, layout=layout)
        ring = fwd_and_fwd_bwd(lambda *t: ring_attention(*t, causal=causal, layout=layout),
                               qs, ks, vs, ds)
        alone = fwd_and_fwd_bwd(lambda *t: RingAttention.apply(*t, Ring(transfer=False), causal,
                                                               scale, layout, options)[0], qs, ks, vs, ds)
        comm = transfers(ks, vs)
        for op in ("fwd", "fwd_bwd"):
            stage(f"N={N} causal={causal} {layout}: {op} of the ring, of its compute alone, of its "
                  "transfers alone")
            ms, peak = timed(ring[op], reps=args.reps, device=device)
            compute, _ = timed(alone[op], reps=args.reps, device=device)
            comm_ms, _ = timed(comm[op], reps=args.reps, device=device)
            hidden = min(1.0, max(0.0, (compute + comm_ms - ms) / comm_ms)) if comm_ms > 0 else None
            records.append(record(op, f"ring_{layout}", dtype, *shape, causal, ms, peak, world=world,
                                  layout=layout, speedup_vs_1gpu=single[op] / ms,
                                  ms_compute_only=compute, ms_comm_only=comm_ms, comm_hidden=hidden))
            log(records[-1])
    return records


def environment(device, world, backend):
    import triton

    if device.type == "cuda":
        from .harness import environment as gpu_environment
        env = gpu_environment()
    else:
        now = datetime.datetime.now(datetime.timezone.utc)
        env = dict(gpu="cpu", sm_count=None, torch=torch.__version__, triton=triton.__version__,
                   cuda=None, date=now.isoformat(timespec="seconds"))
    return dict(env, world=world, backend=backend)


def describe(r):
    shape = f"B{r['B']} H{r['Hq']}/{r['Hkv']} N{r['Nq']} d{r['D']}{' causal' if r['causal'] else ''}"
    text = (f"{r['op']:8}{r['impl']:17}{shape:32}{r['ms']:10.3f} ms {r['tflops']:8.1f} TFLOP/s "
            f"{r['tokens_per_s']:12.0f} tok/s  x{r['speedup_vs_1gpu']:.2f}")
    if r.get("ms_compute_only") is not None:
        hidden = "-" if r["comm_hidden"] is None else f"{r['comm_hidden']:.2f}"
        text += (f"  compute only {r['ms_compute_only']:.3f} ms, comm only {r['ms_comm_only']:.3f} ms,"
                 f" hidden {hidden}")
    return text


def plot(records, path, title):
    """Tokens per second of one GPU and the ring, per shape; one panel per op."""
    harness.plot(records, path, title, value="tokens_per_s", ylabel="tokens / s",
                 label=lambda r: f"N{r['Nq'] // 1024}k{' causal' if r['causal'] else ''}",
                 impl_label=lambda r: r["impl"] if r["impl"] == "flashlib" else
                 f"{r['impl']} x{r.get('world', '')}")


def main_worker(args):
    """Everything one rank does, inside an initialised process group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = args.backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    out_dir = pathlib.Path(args.out)
    name = f"ring_{args.dtype}"
    env = environment(device, world, args.backend)
    records, lines = [], []

    def log(item):
        text = describe(item) if isinstance(item, dict) else item
        lines.append(text)
        if rank == 0:
            print(text, flush=True)
            (out_dir / f"{name}.log").write_text("\n".join(lines) + "\n")
            if records:
                (out_dir / f"{name}.json").write_text(json.dumps(dict(env=env, records=records), indent=1))

    started = time.perf_counter()

    def stage(text):   # before each stage: at real sizes compiling and timing are long and silent
        if rank == 0:
            print(f"[{time.perf_counter() - started:7.1f} s] {text}", flush=True)

    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    log(f"ring attention, {world} ranks ({args.backend}), {env['gpu']}, torch {env['torch']}, "
        f"triton {env['triton']}, {env['date']}; {args.dtype}, B={args.batch} Hq={args.heads} "
        f"Hkv={args.heads_kv} D={args.headdim}, {args.reps} reps after a warm-up")
    for causal in (False, True):
        checked = check(args.batch, args.check_heads, max(1, args.check_heads // 4), args.check_seqlen,
                        args.headdim, args.dtype_t, device, causal=causal, stage=stage,
                        layouts=("contiguous", "zigzag") if causal else ("contiguous",))
        for layout, ratios in checked.items():
            verdict = "ok" if max(ratios.values()) <= 1 else "WRONG"
            worst = ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
            log(f"check N={args.check_seqlen} Hq={args.check_heads} causal={causal} {layout}: "
                f"{verdict} (error / tolerance, worst rank: {worst})")
            if verdict != "ok":
                raise SystemExit(f"ring attention is wrong at N={args.check_seqlen}: not timed")
    for N in args.seqlens:
        for causal in (False, True):
            for r in bench_seqlen(N, causal, args, device, log, stage):
                records.append(r)
            log(f"-- N={N} causal={causal} done")
    if rank == 0:
        (out_dir / f"{name}.json").write_text(json.dumps(dict(env=env, records=records), indent=1))
        try:
            plot(records, out_dir / f"{name}.png", f"ring attention, {world} ranks, {args.dtype}")
        except ImportError:
            pass


def _spawned(rank, world, port, args):
    if args.backend == "nccl":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    try:
        main_worker(args)
    finally:
        dist.destroy_process_group()


def parse_args(argv=None):
    """The command line's options, with --smoke's sizes and the derived dtype, backend and folder
    filled in; returns (args, parser)."""
    parser = argparse.ArgumentParser(prog="python -m flashlib.bench.ring", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder (default benchmarks/results/<gpu>)")
    parser.add_argument("--nproc", type=int, default=2, help="processes to spawn without torchrun")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536, 131072])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=None, help="default: --heads")
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--check-seqlen", type=int, default=16384)
    parser.add_argument("--check-heads", type=int, default=8, help="grouped heads: a quarter for K/V")
    parser.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny sizes: that it runs")
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", args.nproc))
    if args.smoke:                  # 2W chunks of 16 positions: zigzag's layout at any world size
        args.seqlens, args.heads, args.headdim, args.reps = [32 * world], 2, 16, 1
        args.check_seqlen, args.check_heads = 32 * world, 4
    for name, N in [("--seqlens", N) for N in args.seqlens] + [("--check-seqlen", args.check_seqlen)]:
        if N % (2 * world):
            parser.error(f"{name} {N}: every length must split into 2 x {world} equal chunks "
                         f"(the zigzag layout over {world} ranks)")
    args.heads_kv = args.heads if args.heads_kv is None else args.heads_kv
    args.dtype_t = getattr(torch, args.dtype)
    args.backend = "gloo" if args.smoke else "nccl"
    if not args.smoke and runtime.DEVICE.type != "cuda":
        parser.error("benchmarks need CUDA GPUs (--smoke runs tiny sizes on the CPU with gloo)")
    args.out = args.out or str(pathlib.Path("benchmarks/results") / runtime.gpu_name())
    return args, parser


def main(argv=None):
    args, parser = parse_args(argv)
    if "RANK" in os.environ:                                     # torchrun started this process
        if args.smoke and not runtime.INTERPRET:
            parser.error("--smoke runs the interpreter: start it with python -m, not torchrun")
        if args.backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(args.backend)
        try:
            main_worker(args)
        finally:
            dist.destroy_process_group()
        return
    if args.backend == "nccl" and torch.cuda.device_count() < args.nproc:
        parser.error(f"--nproc {args.nproc} needs as many GPUs; this machine has "
                     f"{torch.cuda.device_count()}")
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"                     # the children's kernels: CPU
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_spawned, args=(args.nproc, port, args), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
