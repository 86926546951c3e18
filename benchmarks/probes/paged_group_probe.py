"""Why is a one-wave paged decode with page ids a tile ahead slower at GQA than at MHA?

paged_split_probe.py --shapes (NOTES.md, thirty-first session): B4 Hkv8, 4k keys, pages of 16,
4 splits (128 programs), ids ahead: 0.95x the contiguous cache with one query head per K/V head
(Hq 8) and 0.83x with four (Hq 32), on the same pool, with the same main loop in the SASS for
sm90. Three modes, each in its own process (Triton specialises an int argument equal to 1):

    PYTHONPATH=$PWD python benchmarks/probes/paged_group_probe.py time [--no-specialize]
    ncu --section ... python benchmarks/probes/paged_group_probe.py once
    PYTHONPATH=$PWD python benchmarks/probes/paged_group_probe.py configs [ROUNDS]

``time``: graph times (``bench.decode.graph_time``) of mha4 (B4 Hq8 Hkv8) and gqa4 (B4 Hq32 Hkv8),
contiguous and paged, after a check against the float64 oracle; ``--no-specialize``: the kernel's
GROUP and Nq never specialised on 1. ``once``: one paged call of each, for a profiler.
``configs``: pages of 16 on a one-wave grid with ids ahead under other (BLOCK_N, warps, stages)
than the decode table's, at 1k-8k keys, for the suite's mha (B1 H32) and gqa (B8 32/8)
and the two above; beside the contiguous cache and the paged call as the heuristic plans it.
A one-wave program is 4 warps, one a scheduler: more warps, or fewer 64-bit addresses per thread
(a shorter key tile), may hide more of each load's latency.
"""
import sys

import torch

from flashlib import runtime
from flashlib.bench import decode as bench_decode
from flashlib.bench.harness import make_inputs
from flashlib.bench.production import page_order, to_pages
from flashlib.decode import decode_attention
from flashlib.kernels import decode as kdecode

SHAPES = {"mha4": dict(B=4, Hq=8, Hkv=8, D=128), "gqa4": dict(B=4, Hq=32, Hkv=8, D=128)}
L, PAGE, SPLITS = 4096, 16, 4
CONFIG_SHAPES = {"mha": (bench_decode.MHA, 4), "gqa": (bench_decode.GQA, 2), **{k: (v, 4) for k, v in SHAPES.items()}}
CONFIGS = (None, (128, 4, 3), (128, 8, 3), (64, 4, 3))
CONFIG_LENGTHS = (1024, 2048, 4096, 8192)


def case(shape, L=L):
    B, Hq, Hkv, D = shape["B"], shape["Hq"], shape["Hkv"], shape["D"]
    q, _, _ = make_inputs(B, Hq, Hkv, 1, 1, D, torch.float16, runtime.DEVICE)
    _, k, v = make_inputs(B, 1, Hkv, 1, L, D, torch.float16, runtime.DEVICE)
    order, table = page_order(B, -(-L // PAGE))
    seqlens = [L] * B
    lens = bench_decode.device_lengths(tuple(seqlens), runtime.DEVICE)
    paged = (to_pages(k, PAGE, order), to_pages(v, PAGE, order), table.to(runtime.DEVICE))
    return q, k, v, paged, seqlens, lens


def call(q, k, v, lens, seqlens, table=None):
    return decode_attention(q, k, v, cache_seqlens=lens, block_table=table, num_splits=SPLITS, check_table=False,
                            host_lengths=seqlens, kernel_options={"decode_page_ids_ahead": True})


def configs(rounds):
    """One-wave grids of pages of 16, ids ahead, under CONFIGS; ratios to the contiguous cache."""
    options = runtime.options({"decode_page_ids_ahead": True})
    print(f"{'case':12}{'cache':>12}{'config':>14}{'us graph':>10}{'TB/s':>7}{'vs contiguous':>15}  round")
    for name, (shape, splits) in CONFIG_SHAPES.items():
        for length in CONFIG_LENGTHS:
            q, k, v, (kp, vp, table), seqlens, lens = case(shape, length)
            nbytes = bench_decode.kv_bytes(shape, seqlens, 2)
            runs = [("contiguous", (k, v), None, None, None), ("paged heur", (kp, vp), table, None, None)]
            runs += [("paged 1wave", (kp, vp), table, splits, config) for config in CONFIGS]
            for r in range(rounds):
                base = None
                for label, caches, tab, n, config in runs:
                    def fn(q, k, v, _, tab=tab, n=n, config=config):
                        return kdecode.flash_decode_forward(q, k, v, lens, num_splits=n, config=config, block_table=tab,
                                                            options=options, longest=length, ragged=False)[0]
                    with torch.no_grad():
                        out = fn(q, *caches, None)
                    err, ok = bench_decode.check_decode(lambda qs, *_: out[:, :qs.shape[1]], q, k, v, seqlens)
                    if not ok:
                        print(f"{name} L{length:<7}{label:>12}{str(config):>14}  wrong: {err:.3g}", flush=True)
                        continue
                    ms = bench_decode.graph_time(fn, q, *caches, None)
                    base = base or ms
                    print(f"{name} L{length:<7}{label:>12}{str(config).replace(' ', ''):>14}{ms * 1e3:10.2f}"
                          f"{nbytes / ms / 1e9:7.2f}{base / ms:15.3f}  {r}", flush=True)


def main(mode, no_specialize):
    if mode == "configs":
        return configs(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    if no_specialize:
        for p in kdecode._decode_partial_kernel.params:
            if p.name in ("GROUP", "Nq"):
                p.do_not_specialize = True
    for name, shape in SHAPES.items():
        q, k, v, (kp, vp, table), seqlens, lens = case(shape)
        if mode == "once":
            with torch.no_grad():
                call(q, kp, vp, lens, seqlens, table)
            torch.cuda.synchronize()
            continue
        nbytes = bench_decode.kv_bytes(shape, seqlens, 2)
        for label, caches, tab in (("contiguous", (k, v), None), ("paged 16", (kp, vp), table)):
            with torch.no_grad():
                out = call(q, *caches, lens, seqlens, tab)
            err, ok = bench_decode.check_decode(lambda qs, *_: out[:, :qs.shape[1]], q, k, v, seqlens)
            ms = bench_decode.graph_time(lambda q, k, v, _, tab=tab: call(q, k, v, lens, seqlens, tab), q, *caches, None)
            print(f"{name} {label:11} {'no-specialize' if no_specialize else 'specialized':14} {ms * 1e3:7.2f} us "
                  f"{nbytes / ms / 1e9:5.2f} TB/s  check {'ok' if ok else 'WRONG'} ({err:.2g})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], "--no-specialize" in sys.argv)
