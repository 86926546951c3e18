"""Probe: where a GPT-2 training step's time goes, flashlib against SDPA's default (issue 54).

The model suite's GPT-2 rows at B32 T256 (eager 0.91x, compiled 0.76x on an H200) are far from
what the attention kernels alone explain. This times the suite's step (``bench.model``'s
``build``/``train_step``, bf16 autocast, fused AdamW) eager and under ``torch.compile``, in
alternating rounds, then profiles a few steps of each with ``torch.profiler`` and prints, per
(impl, mode): the step's wall ms, the GPU's kernel-busy ms and idle ms per step (from the trace:
``teach.trace.idle_gaps``), host syncs per step (runtime calls naming Synchronize or a
device-to-host copy), kernels per step, and the kernels that differ most in total time.

``--fa3-from-flops N`` adds a third model, flashlib with ``KernelOptions.fa3_from_flops`` N (the
FLOPs from which a call runs FA3's kernels; 1: every call), timed in the same rounds: at GPT-2's
shapes the default runs FA2, chosen where a call alone is host-bound (``fa3_threshold_probe.py``),
while an eager step at B8 T1024 keeps the GPU busy (24.5 of 25.4 ms), where kernel time decides.

    python benchmarks/probes/model_step_profile.py [--shapes 32x256,8x1024] [--modes eager,compiled]
        [--cprofile 20]   (also: the host's Python per step, cProfile of 20 steps, top functions)
        [--fa3-from-flops 1]
"""
import argparse
import cProfile
import io
import json
import pstats
import os
import statistics
import tempfile

import torch

from flashlib import flash_attention
from flashlib.bench import model as M
from flashlib.teach import trace as T


def profile(step, n):
    """Chrome-trace events of n steps (after a sync), from torch.profiler."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        return T.events_of(json.load(f))


def summarise(events, n):
    kernels = T.kernel_summary(events)
    busy = sum(total for _, total, _ in kernels.values()) / n / 1e3
    idle = sum(b - a for gaps in T.idle_gaps(events).values() for a, b in gaps) / n / 1e3
    runtime = {}
    for cat in T.LAUNCH_CATEGORIES:
        for name, (count, total, _) in T.kernel_summary(events, category=cat).items():
            runtime[name] = runtime.get(name, 0) + count
    syncs = {k: v / n for k, v in runtime.items() if "ynchronize" in k or "DtoH" in k or "Memcpy" in k}
    copies = T.kernel_summary(events, category="gpu_memcpy")
    launches = sum(c for c, _, _ in kernels.values()) / n
    return dict(busy=busy, idle=idle, syncs=syncs, launches=launches, copies={k: v[0] / n for k, v in copies.items()},
                kernels={k: (c / n, t / n) for k, (c, t, _) in kernels.items()})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="32x256,8x1024")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--cprofile", type=int, default=0)
    parser.add_argument("--fa3-from-flops", type=int)
    args = parser.parse_args()
    attention = dict(M.ATTENTION)
    if args.fa3_from_flops is not None:
        options = {"fa3_from_flops": args.fa3_from_flops}
        attention[f"flashlib_fa3_from_{args.fa3_from_flops}"] = lambda q, k, v, cache=None: flash_attention(
            q, k, v, causal=True, kernel_options=options)
    impls = tuple(attention)
    dtype = torch.bfloat16
    cfg = M.GPT2
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for shape in args.shapes.split(","):
        B, Tn = map(int, shape.split("x"))
        idx, targets = M.random_tokens(cfg.vocab_size, B, Tn, 1), M.random_tokens(cfg.vocab_size, B, Tn, 2)
        for mode in args.modes.split(","):
            models = {impl: M.build(cfg, attention[impl]) for impl in impls}
            for impl in impls[1:]:
                models[impl].load_state_dict(models["flashlib"].state_dict())
            runners = {impl: torch.compile(m, dynamic=False) if mode == "compiled" else m
                       for impl, m in models.items()}
            opts = {impl: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for impl, m in models.items()}
            steps = {impl: (lambda r=runners[impl], o=opts[impl]: M.train_step(r, o, idx, targets, dtype))
                     for impl in impls}
            losses = {impl: steps[impl]().item() for impl in impls}
            for impl in impls:
                M.timed_calls(steps[impl], 3)
            times = {impl: [] for impl in impls}
            for _ in range(args.rounds):
                for impl in impls:
                    times[impl] += M.timed_calls(steps[impl], args.steps)
            summaries = {impl: summarise(profile(steps[impl], 3), 3) for impl in impls}
            ms = {impl: statistics.median(times[impl]) for impl in impls}
            print(f"\n## GPT-2 B{B} T{Tn} {mode}: first losses {losses}")
            for impl in impls:
                s = summaries[impl]
                print(f"{impl:13s} step {ms[impl]:7.2f} ms | GPU busy {s['busy']:6.2f} ms, idle {s['idle']:5.2f} ms"
                      f" | kernels/step {s['launches']:.0f} | syncs/step {s['syncs']} | memcpy/step {s['copies']}")
            for impl in (i for i in impls if i != "sdpa_default"):
                print(f"ratio sdpa/{impl} {ms['sdpa_default'] / ms[impl]:.3f}")
            names = set(summaries["flashlib"]["kernels"]) | set(summaries["sdpa_default"]["kernels"])
            diff = []
            for name in names:
                f = summaries["flashlib"]["kernels"].get(name, (0, 0.0))
                s = summaries["sdpa_default"]["kernels"].get(name, (0, 0.0))
                diff.append((f[1] - s[1], name, f, s))
            diff.sort(key=lambda r: -abs(r[0]))
            print("kernel (per step)                                                   flashlib n/us    sdpa n/us")
            for d, name, f, s in diff[:18]:
                print(f"  {name[:66]:66s} {f[0]:4.0f} {f[1]:8.1f}  {s[0]:4.0f} {s[1]:8.1f}")
            for impl in impls if args.cprofile else ():
                prof = cProfile.Profile()
                torch.cuda.synchronize()
                prof.enable()
                for _ in range(args.cprofile):
                    steps[impl]()
                torch.cuda.synchronize()
                prof.disable()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
                print(f"### cProfile, {impl}, {args.cprofile} steps\n" + text.getvalue().split("\n\n", 1)[-1])
            del models, runners, opts, steps
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
