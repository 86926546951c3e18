"""``python -m flashlib.bench [--suite ...]``: run benchmark suites, write JSON and PNG results.

The suites live beside this file: ``harness`` (forward, backward, paper, memory), ``short``, ``fp8``, ``production``,
``decode``, ``sparse`` and ``model`` (whole models' training steps, decoding and first step: long,
so never in the default run); ``flashlib.bench``'s docstring says how each measures.
"""
import argparse
import json
import pathlib

import torch

from .. import runtime
from . import harness
from .harness import (add_ratios, environment, implementations, plot, plot_memory, print_table,
                      run_case, suite_cases)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashlib.bench", description=harness.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", nargs="+", default=["forward", "backward", "paper", "memory"],
                        choices=["forward", "backward", "paper", "memory", "short", "block_sparse",
                                 "decode", "fp8", "production", "model"])
    parser.add_argument("--dtype", default=None, choices=["float16", "bfloat16"],
                        help="default float16; the model suite's autocast bfloat16")
    parser.add_argument("--impl", nargs="+", default=None, help="only these implementations")
    parser.add_argument("--quick", action="store_true",
                        help="fewer shapes (three forward ones; the model suite: GPT-2 B8 T1024 only)")
    parser.add_argument("--out", default=None, help="folder (default benchmarks/results/<gpu>)")
    parser.add_argument("--parts", default="train,compiled,decode,first",
                        help="model suite: which of train,compiled,decode,first to run")
    parser.add_argument("--tiny", action="store_true",
                        help="model suite: tiny models (2 layers, d 64, T 32), runs on a CPU too")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if args.tiny and args.suite != ["model"]:
        parser.error("--tiny is the model suite's: use it with --suite model alone")
    if runtime.DEVICE.type != "cuda" and not args.tiny:
        parser.error("benchmarks need a CUDA GPU (the interpreter is for correctness, not speed)")
    from tqdm.auto import tqdm
    out_dir = pathlib.Path(args.out or pathlib.Path("benchmarks/results") / runtime.gpu_name())
    out_dir.mkdir(parents=True, exist_ok=True)
    for suite in args.suite:
        if suite == "model":   # whole models: see flashlib.bench.model
            from . import model as bench_model
            unknown = set(parts) - set(bench_model.PARTS)
            if unknown:
                parser.error(f"--parts: unknown {sorted(unknown)}; choose from {list(bench_model.PARTS)}")
            dtype = getattr(torch, args.dtype or "bfloat16") if runtime.DEVICE.type == "cuda" else torch.float32
            bench_model.run_suite(dtype, out_dir, parts=parts, quick=args.quick, tiny=args.tiny)
            continue
        args.dtype = args.dtype or "float16"
        dtype = getattr(torch, args.dtype)
        if suite == "block_sparse":
            from . import sparse as bench_sparse
            records = bench_sparse.run_suite(dtype, quick=args.quick, impls=args.impl, progress=tqdm)
            name = f"{suite}_{args.dtype}"
            (out_dir / f"{name}.json").write_text(json.dumps(dict(env=environment(), records=records), indent=1))
            bench_sparse.plot(records, out_dir / f"{name}.png", f"{suite} {args.dtype}")
            bench_sparse.print_table(records)
            continue
        if suite == "short":     # eager forward+backward of GPT-sized shapes, with host time
            from . import short
            records, launches = short.run_suite(dtype, quick=args.quick, impls=args.impl, progress=tqdm)
            name = f"{suite}_{args.dtype}"
            (out_dir / f"{name}.json").write_text(json.dumps(
                dict(env=environment(), records=records, launch_host_us=launches), indent=1))
            label = lambda r: f"d{r['D']} N{r['Nq']}"   # noqa: E731
            plot(records, out_dir / f"{name}.png", f"{suite} {args.dtype}, causal", value="ms",
                 ylabel="ms per forward+backward", label=label)
            plot(records, out_dir / f"{name}_host.png", f"{suite} {args.dtype}", value="host_us",
                 ylabel="host us per forward+backward", label=label)
            short.print_table(records, launches)
            continue
        if suite == "fp8":     # FP8 forward against fp16 and cuDNN, with its error
            from . import fp8 as bench_fp8
            records = bench_fp8.run_suite(quick=args.quick, progress=tqdm)
            (out_dir / "fp8_forward.json").write_text(json.dumps(dict(env=environment(), records=records), indent=1))
            plot([dict(r, impl=f"{r['impl']} {r['dtype']}") for r in records],   # bars per dtype
                 out_dir / "fp8_forward.png", "forward, FP8 and fp16")
            bench_fp8.print_table(records)
            continue
        if suite == "decode":  # TB/s of K/V cache read: see flashlib.bench.decode
            from . import decode as bench_decode
            bench_decode.run_suite(dtype, out_dir, names=args.impl, quick=args.quick)
            continue
        if suite == "production":  # varlen, paged decode, softcap/ALiBi: see flashlib.bench.production
            from . import production
            production.run_suite(dtype, out_dir, quick=args.quick, impls=args.impl, progress=tqdm)
            continue
        cases = suite_cases(suite, args.quick)
        impls = implementations(args.impl)
        records = []
        work = [(n, s, c, ops) for names, s, c, ops in cases for n in names if n in impls]
        for name, shape, causal, ops in tqdm(work, desc=suite):
            records += run_case(name, impls[name], shape, causal, dtype, ops)
        add_ratios(records)
        name = f"{suite}_{args.dtype}"
        (out_dir / f"{name}.json").write_text(json.dumps(
            dict(env=environment(), records=records), indent=1))
        (plot_memory if suite == "memory" else plot)(records, out_dir / f"{name}.png", f"{suite} {args.dtype}")
        print_table(records)




if __name__ == "__main__":
    main()
