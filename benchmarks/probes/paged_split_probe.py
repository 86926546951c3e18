"""Paged decode at short caches against the split count (issue 34: mha 1k keys at 0.81x contiguous).

At B=1 H=32 d128 and 1k keys the heuristic gave 4 splits of 4 key blocks (128 programs, one
wave), and pages of 16 and of 256 lost alike: the page ids' loads come before the first K/V loads
of each program (benchmarks/probes/NOTES.md). Would more programs, or fewer, hide it? (Its first log,
h100/paged_split_probe.log: 8 splits, two programs an SM; the heuristic's ``paged`` rule since.)
"heur" is ``kernels.decode.num_splits_heuristic``'s pick for that cache, paged or not, from the
lengths on the host as ``KVCache.attend`` passes them (``host_lengths``: equal, not ragged). Every
(case, page size, splits) is checked against the float64 oracle, then timed in a CUDA graph
(``bench.decode.graph_time``); rounds alternate so that the spread shows. Ratio: TB/s over the
contiguous cache at the heuristic's split count, same round.

A paged cache's column reads "16", "256" with ``KernelOptions.decode_page_ids_ahead`` off (each
tile's page ids loaded in its own iteration); with ``--ids-ahead`` also "16+", "256+", the option
on (the default): a grid of one wave at most then loads them a tile ahead, so that Triton's
pipeline keeps two K/V tiles in flight as for a contiguous cache (the TTGIR for sm90 held one).
``--lengths`` and ``--splits`` pick the caches and split counts (default: the short caches, every
count; "heur" for the heuristic's alone). ``--pages-in-order``: each sequence's pages one run of the
pool instead of shuffled over it (is a page of 16's cost its scattered reads?). ``--shapes``
replaces the two cases with others, ``name=B:Hq:Hkv:D`` each (which of group size, batch and
split count makes a one-wave grid of pages of 16 slow?).

    PYTHONPATH=$PWD FLASHLIB_AUTOTUNE=0 python benchmarks/probes/paged_split_probe.py [ROUNDS]
        [--ids-ahead] [--lengths 512,1024,2048,16384] [--splits heur] [--pages-in-order]
        [--shapes mha8=8:8:8:128,gqa4=4:32:8:128]
"""
import argparse

import torch

from flashlib import runtime
from flashlib.bench import decode as bench_decode
from flashlib.bench.harness import make_inputs
from flashlib.bench.production import page_order, to_pages
from flashlib.decode import decode_attention

SHAPES = {"mha": bench_decode.MHA, "gqa": bench_decode.GQA}
LENGTHS = {"mha": (512, 1024, 2048), "gqa": (512, 1024)}
PAGES = (None, 16, 256)
SPLITS = (None, 1, 2, 4, 8, 16)


def setups(shape, L, dtype=torch.float16, shuffled=True):
    """(page size, caches, table) for the contiguous cache and each page size, one set of inputs."""
    B, Hq, Hkv, D = shape["B"], shape["Hq"], shape["Hkv"], shape["D"]
    dev = runtime.DEVICE
    q, _, _ = make_inputs(B, Hq, Hkv, 1, 1, D, dtype, dev)
    _, k, v = make_inputs(B, 1, Hkv, 1, L, D, dtype, dev)
    out = [(None, (k, v), None)]
    for page in PAGES[1:]:
        order, table = page_order(B, -(-L // page), shuffled=shuffled)
        out.append((page, (to_pages(k, page, order), to_pages(v, page, order)), table.to(dev)))
    return q, k, v, out


def parse_shapes(text):
    """``name=B:Hq:Hkv:D,...`` -> {name: shape}, shapes as ``bench.decode``'s."""
    shapes = {}
    for item in text.split(","):
        name, dims = item.split("=")
        shapes[name] = dict(zip(("B", "Hq", "Hkv", "D"), map(int, dims.split(":"))))
    return shapes


def main(rounds, ids_ahead=False, lengths=None, splits_run=SPLITS, shuffled=True, shapes=None):
    print(f"{'case':12}{'page':>6}{'splits':>8}{'ms graph':>10}{'TB/s':>7}{'vs contiguous':>15}  round")
    cases = [(label, shape, L) for label, shape in (shapes or SHAPES).items()
             for L in (lengths or LENGTHS.get(label, LENGTHS["gqa"]))]
    for label, shape, L in cases:
        q, k, v, variants = setups(shape, L, shuffled=shuffled)
        variants = [(page, caches, table, False) for page, caches, table in variants]
        if ids_ahead:
            variants += [(page, caches, table, True) for page, caches, table, _ in variants if page]
        seqlens = [L] * shape["B"]
        lens = bench_decode.device_lengths(tuple(seqlens), runtime.DEVICE)
        nbytes = bench_decode.kv_bytes(shape, seqlens, 2)
        for r in range(rounds):
            base = None
            for page, caches, table, ahead in variants:
                for splits in splits_run:
                    def fn(q, k, v, _, table=table, splits=splits, options={"decode_page_ids_ahead": ahead}):
                        return decode_attention(q, k, v, cache_seqlens=lens, block_table=table, num_splits=splits,
                                                check_table=False, host_lengths=seqlens, kernel_options=options)
                    name = f"{page}{'+' if ahead else ''}" if page else "-"
                    with torch.no_grad():
                        out = fn(q, *caches, None)
                    err, ok = bench_decode.check_decode(lambda qs, *_: out[:, :qs.shape[1]], q, k, v, seqlens)
                    if not ok:
                        print(f"{label} L{L:<7}{name:>6}{splits or 'heur':>8}  wrong: {err:.3g}")
                        continue
                    ms = bench_decode.graph_time(fn, q, *caches, None)
                    tbs = nbytes / ms / 1e9
                    if page is None and splits is None:
                        base = tbs
                    ratio = f"{tbs / base:15.3f}" if base else f"{'-':>15}"   # the base was wrong
                    print(f"{label} L{L:<7}{name:>6}{splits or 'heur':>8}{ms:10.4f}{tbs:7.2f}"
                          f"{ratio}  {r}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds", nargs="?", type=int, default=2)
    ap.add_argument("--ids-ahead", action="store_true")
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--splits", type=lambda s: [None if x == "heur" else int(x) for x in s.split(",")],
                    default=SPLITS)
    ap.add_argument("--pages-in-order", action="store_true")
    ap.add_argument("--shapes", type=parse_shapes)
    args = ap.parse_args()
    main(args.rounds, args.ids_ahead, args.lengths, args.splits, not args.pages_in_order, args.shapes)
