"""Paged decode at short caches against the split count (issue 34: mha 1k keys at 0.81x contiguous).

At B=1 H=32 d128 and 1k keys the heuristic gave 4 splits of 4 key blocks (128 programs, one
wave), and pages of 16 and of 256 lost alike: the page ids' loads come before the first K/V loads
of each program (benchmarks/probes/NOTES.md). Would more programs, or fewer, hide it? (Its first log,
h100/paged_split_probe.log: 8 splits, two programs an SM; the heuristic's ``paged`` rule since.)
"heur" is ``kernels.decode.num_splits_heuristic``'s pick for that cache, paged or not. Every
(case, page size, splits) is checked against the float64 oracle, then timed in a CUDA graph
(``bench.decode.graph_time``); rounds alternate so that the spread shows. Ratio: TB/s over the
contiguous cache at the heuristic's split count, same round.

    PYTHONPATH=$PWD FLASHLIB_AUTOTUNE=0 python benchmarks/probes/paged_split_probe.py [ROUNDS]
"""
import sys

import torch

from flashlib import runtime
from flashlib.bench import decode as bench_decode
from flashlib.bench.harness import make_inputs
from flashlib.bench.production import page_order, to_pages
from flashlib.decode import decode_attention

CASES = [("mha", bench_decode.MHA, 512), ("mha", bench_decode.MHA, 1024), ("mha", bench_decode.MHA, 2048),
         ("gqa", bench_decode.GQA, 512), ("gqa", bench_decode.GQA, 1024)]
PAGES = (None, 16, 256)
SPLITS = (None, 1, 2, 4, 8, 16)


def setups(shape, L, dtype=torch.float16):
    """(page size, caches, table) for the contiguous cache and each page size, one set of inputs."""
    B, Hq, Hkv, D = shape["B"], shape["Hq"], shape["Hkv"], shape["D"]
    dev = runtime.DEVICE
    q, _, _ = make_inputs(B, Hq, Hkv, 1, 1, D, dtype, dev)
    _, k, v = make_inputs(B, 1, Hkv, 1, L, D, dtype, dev)
    out = [(None, (k, v), None)]
    for page in PAGES[1:]:
        order, table = page_order(B, -(-L // page))
        out.append((page, (to_pages(k, page, order), to_pages(v, page, order)), table.to(dev)))
    return q, k, v, out


def main(rounds):
    print(f"{'case':12}{'page':>6}{'splits':>8}{'ms graph':>10}{'TB/s':>7}{'vs contiguous':>15}  round")
    for label, shape, L in CASES:
        q, k, v, variants = setups(shape, L)
        seqlens = [L] * shape["B"]
        lens = bench_decode.device_lengths(tuple(seqlens), runtime.DEVICE)
        nbytes = bench_decode.kv_bytes(shape, seqlens, 2)
        for r in range(rounds):
            base = None
            for page, caches, table in variants:
                for splits in SPLITS:
                    def fn(q, k, v, _, table=table, splits=splits):
                        return decode_attention(q, k, v, cache_seqlens=lens, block_table=table,
                                                num_splits=splits, check_table=False)
                    with torch.no_grad():
                        out = fn(q, *caches, None)
                    err, ok = bench_decode.check_decode(lambda qs, *_: out[:, :qs.shape[1]], q, k, v, seqlens)
                    if not ok:
                        print(f"{label} L{L:<7}{page or '-':>6}{splits or 'heur':>8}  wrong: {err:.3g}")
                        continue
                    ms = bench_decode.graph_time(fn, q, *caches, None)
                    tbs = nbytes / ms / 1e9
                    if page is None and splits is None:
                        base = tbs
                    ratio = f"{tbs / base:15.3f}" if base else f"{'-':>15}"   # the base was wrong
                    print(f"{label} L{L:<7}{page or '-':>6}{splits or 'heur':>8}{ms:10.4f}{tbs:7.2f}"
                          f"{ratio}  {r}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
