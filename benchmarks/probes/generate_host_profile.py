"""Probe: the host's Python per decoding step of ``GPT.generate``, flashlib against SDPA (issue 54).

The model suite's decode rows (GPT-2 small, bfloat16, 512-token prompt) are host-bound at B1 and
B8: a step is 12 layers of tiny kernels. This runs the suite's two models (``bench.model.build``,
flashlib's KVCache and SDPA's preallocated cache), times generate(1 + n) against generate(1) as
the suite does, then prints a cProfile of generate(1 + n) per implementation (top functions by
own time), so the two can be compared call by call.

    PYTHONPATH=$PWD python benchmarks/probes/generate_host_profile.py [--batch 1] [--new 64]
"""
import argparse
import cProfile
import io
import pstats
import statistics

import torch

from flashlib.bench import model as M


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    models = {impl: M.build(M.GPT2, M.ATTENTION[impl], M.CACHE[impl]).to(torch.bfloat16) for impl in M.IMPLS}
    models["sdpa_default"].load_state_dict(models["flashlib"].state_dict())
    prompt = M.random_tokens(M.GPT2.vocab_size, args.batch, 512, 4)
    times = {(impl, n): [] for impl in M.IMPLS for n in (1, 1 + args.new)}
    for impl in M.IMPLS:
        for n in (1, 1 + args.new):
            models[impl].generate(prompt, n)
    for _ in range(args.rounds):
        for impl in M.IMPLS:
            for n in (1, 1 + args.new):
                times[impl, n] += M.timed_calls(lambda: models[impl].generate(prompt, n), 1)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, GPT-2 bf16 B{args.batch}, prompt 512")
    for impl in M.IMPLS:
        full, one = (statistics.median(times[impl, n]) for n in (1 + args.new, 1))
        print(f"{impl:13s} ms per new token {(full - one) / args.new:.3f}")
    for impl in M.IMPLS:
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        models[impl].generate(prompt, 1 + args.new)
        torch.cuda.synchronize()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(f"\n### cProfile of generate(1 + {args.new}), {impl}\n" + text.getvalue().split("\n\n", 1)[-1])


if __name__ == "__main__":
    main()
