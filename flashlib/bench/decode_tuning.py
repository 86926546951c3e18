"""Tuning the decode kernels on a GPU: ``python -m flashlib.bench.decode_tuning --sweep | --host``.

``--sweep`` times ``kernels.decode``'s partial kernel for every (block config, split count) on the
decode suite's two shapes, from CUDA graphs, and prints the best five beside the heuristic's
choice: how ``kernels.decode``'s tables were chosen, and how to choose them on another GPU.
``--host`` splits one decoding call's host time by part (checks, allocation, launch, with and
without ``kernels.launch.fast_launch``) beside SDPA's whole call. The suite itself is
``python -m flashlib.bench --suite decode`` (``flashlib.bench.decode``).
"""
import argparse
import functools

import torch
import torch.nn.functional as F

from .. import runtime
from ..decode import check_decode_inputs, flash_decode
from ..kernels import decode as kernels
from . import harness as bench
from .decode import GQA, MHA, graph_time, host_time, kv_bytes


def sweep(dtype=torch.float16, lengths=(1024, 4096, 16384, 131072),
          configs=((64, 4, 3), (32, 4, 3), (64, 8, 3), (64, 4, 2)), splits=(1, 2, 4, 8, 16, 32)):
    """Graph times of the two kernels for every (config, num_splits) on the suite's two shapes;
    print the best five per case beside the heuristic's choice."""
    for label, shape in (("mha", MHA), ("gqa", GQA)):
        for L in lengths:
            B, Hq, Hkv, D = shape["B"], shape["Hq"], shape["Hkv"], shape["D"]
            q, _, _ = bench.make_inputs(B, Hq, Hkv, 1, 1, D, dtype, runtime.DEVICE)
            _, k, v = bench.make_inputs(B, 1, Hkv, 1, L, D, dtype, runtime.DEVICE)
            gb = kv_bytes(shape, [L] * B, dtype.itemsize) / 1e9
            found = []
            for config in configs:
                for s in splits:
                    fn = functools.partial(kernels.flash_decode_forward, num_splits=s, config=config)
                    found.append((gb / graph_time(lambda q, k, v, _: fn(q, k, v), q, k, v, None),
                                  config, s))
            _, _, config, s = kernels.launch_plan(q, k)
            found.sort(reverse=True)
            print(f"{label} L={L:6}: heuristic {config}/{s}; best " +
                  " ".join(f"{c}/{n}: {t:.2f}" for t, c, n in found[:5]) + " TB/s", flush=True)
            del q, k, v
            torch.cuda.empty_cache()


def host_report(dtype):
    """Where one decoding step's host time goes, per call (``host_time``; B=1 H=32 and B=8 Hq=32
    Hkv=8, L=1k, d=128): flash_decode with and without ``kernels.launch.fast_launch``, the
    two-kernel form, its parts, and SDPA's whole call."""
    import triton

    for shape in (MHA, GQA):
        B, Hq, Hkv, D = shape["B"], shape["Hq"], shape["Hkv"], shape["D"]
        q, k, v = bench.make_inputs(B, Hq, Hkv, 1, 1024, D, dtype, runtime.DEVICE)
        rows = {"flash_decode": lambda: flash_decode(q, k, v)}
        with runtime.kernel_options(fast_launch=False):
            rows["flash_decode, plain kernel[grid] launch"] = host_time(rows["flash_decode"])
        rows["flash_decode"] = host_time(rows["flash_decode"])
        rows["decode_partial + combine"] = host_time(
            lambda: kernels.combine(*kernels.decode_partial(q, k, v), out_dtype=q.dtype))
        rows["checks (check_decode_inputs)"] = host_time(lambda: check_decode_inputs(q, k, v))
        rows["torch.empty"] = host_time(lambda: torch.empty_like(q))
        rows["F.scaled_dot_product_attention"] = host_time(
            lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv))
        print(f"B={B} Hq={Hq} Hkv={Hkv} L=1024 d={D}, splits={kernels.launch_plan(q, k)[3]}, "
              f"Triton {triton.__version__}, fast launch {'on' if fast else 'off'}: host us per call")
        for name, us in rows.items():
            print(f"  {name:40s} {us:7.1f}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashlib.bench.decode_tuning", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="tune: configs x split counts")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="cache lengths of --sweep (default 1k, 4k, 16k, 128k)")
    parser.add_argument("--host", action="store_true", help="host time per call, by part")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = parser.parse_args(argv)
    if runtime.DEVICE.type != "cuda":
        parser.error("benchmarks need a CUDA GPU (the interpreter is for correctness, not speed)")
    dtype = getattr(torch, args.dtype)
    if args.sweep:
        sweep(dtype, **({} if args.lengths is None else {"lengths": args.lengths}))
    if args.host:
        host_report(dtype)
    if not (args.sweep or args.host):
        parser.error("give --sweep, --host or both")


if __name__ == "__main__":
    main()
