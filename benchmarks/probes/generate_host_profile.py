"""Probe: the host's Python per decoding step of ``GPT.generate``, flashlib against SDPA (issue 54).

The model suite's decode rows (GPT-2 small, bfloat16, 512-token prompt) are host-bound at B1 and
B8: a step is 12 layers of tiny kernels. This runs the suite's two models (``bench.model.build``,
flashlib's KVCache and SDPA's preallocated cache), times generate(1 + n) against generate(1) as
the suite does, then prints a cProfile of generate(1 + n) per implementation (top functions by
own time), so the two can be compared call by call. ``flashlib+append`` is flashlib with
``KernelOptions.decode_append`` (the cache write inside the decoding launch).

    PYTHONPATH=$PWD python benchmarks/probes/generate_host_profile.py [--batch 1] [--new 64]
"""
import contextlib
import argparse
import cProfile
import io
import pstats
import statistics

import torch

import flashlib
from flashlib.bench import model as M

RUNS = {"flashlib": ("flashlib", False), "flashlib+append": ("flashlib", True), "sdpa_default": ("sdpa_default", False)}


def options(append):
    return flashlib.kernel_options(decode_append=True) if append else contextlib.nullcontext()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    cfg, T0, dtype = (M.GPT2, 512, torch.bfloat16) if gpu else (M.TINY_GPT, 16, torch.float32)  # CPU: a smoke run
    args.new = args.new if gpu else 4
    models = {impl: M.build(cfg, M.ATTENTION[impl], M.CACHE[impl]).to(dtype) for impl in M.IMPLS}
    models["sdpa_default"].load_state_dict(models["flashlib"].state_dict())
    prompt = M.random_tokens(cfg.vocab_size, args.batch, T0, 4)
    times = {(run, n): [] for run in RUNS for n in (1, 1 + args.new)}
    tokens = {}
    for run, (impl, append) in RUNS.items():
        with options(append):
            tokens[run] = models[impl].generate(prompt, 1 + args.new, generator=torch.Generator(prompt.device).manual_seed(0))
            models[impl].generate(prompt, 1)
    for _ in range(args.rounds):
        for run, (impl, append) in RUNS.items():
            for n in (1, 1 + args.new):
                with options(append):
                    times[run, n] += M.timed_calls(lambda: models[impl].generate(prompt, n), 1)
    print(f"# {torch.cuda.get_device_name() if gpu else 'CPU'}, torch {torch.__version__}, B{args.batch}, prompt {T0}")
    print(f"flashlib+append samples flashlib's tokens: {torch.equal(tokens['flashlib'], tokens['flashlib+append'])}")
    for run in RUNS:
        full, one = (statistics.median(times[run, n]) for n in (1 + args.new, 1))
        print(f"{run:16s} ms per new token {(full - one) / args.new:.3f}")
    for run, (impl, append) in RUNS.items():
        prof = cProfile.Profile()
        M.sync()
        prof.enable()
        with options(append):
            models[impl].generate(prompt, 1 + args.new)
        M.sync()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(f"\n### cProfile of generate(1 + {args.new}), {run}\n" + text.getvalue().split("\n\n", 1)[-1])


if __name__ == "__main__":
    main()
