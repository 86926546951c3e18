"""Decode bandwidth of one call timed four ways, to tell a CUDA graph's effect from the suite's:
events around each synced eager call, ten eager calls back to back, a graph of one call replayed
(as ``flashlib.bench.decode.graph_time`` did), a graph of ten calls. With ``--order``: the
suite's own ``graph_time`` on the suite's inputs (B=8 Hkv=8) after each step the suite takes
before it (``check_decode``, ``do_bench``, ``host_time``), without its warm-up (ten timed
replays, as it was until 2026-11-25) and with it (25 ms untimed, then replays over 100 ms).
GPU only:

    PYTHONPATH=. python benchmarks/probes/decode_graph_probe.py [--order]
"""
import statistics
import sys

import torch
import torch.nn.functional as F

import flashlib  # noqa: F401
from flashlib.decode import flash_decode

dev = "cuda"


def order():
    from flashlib.bench import harness as bench, decode as bd
    fns = bd.implementations(["flashlib", "sdpa_cudnn"])
    for L in (32768, 131072):
        B, Hq, Hkv, D = 8, 32, 8, 128
        q, _, _ = bench.make_inputs(B, Hq, Hkv, 1, 1, D, torch.float16, dev)
        _, k, v = bench.make_inputs(B, 1, Hkv, 1, L, D, torch.float16, dev)
        gb = bd.kv_bytes(bd.GQA, [L] * B, 2) / 1e9
        for name, f in fns.items():
            steps = {"check_decode": lambda: bd.check_decode(f, q, k, v, None),
                     "do_bench": lambda: bench.time_ms(lambda: f(q, k, v, None)),
                     "host_time": lambda: bd.host_time(lambda: f(q, k, v, None))}
            for warm in (False, True):
                found = []
                for step, run in steps.items():
                    with torch.no_grad():
                        run()
                    ms = bd.graph_time(f, q, k, v, None, warmup_ms=25 if warm else 0,
                                       rep_ms=100 if warm else 0)
                    found.append(f"after {step} {gb / ms:.2f}")
                print(f"L={L} {name} graph_time {'with' if warm else 'without'} warm-up: "
                      + ", ".join(found) + " TB/s", flush=True)


if "--order" in sys.argv:
    order()
    sys.exit()
for B, Hq, Hkv, L in [(8, 32, 8, 131072), (1, 32, 32, 131072), (8, 32, 8, 32768)]:
    q = torch.randn(B, Hq, 1, 128, device=dev, dtype=torch.float16)
    k = torch.randn(B, Hkv, L, 128, device=dev, dtype=torch.float16); v = torch.randn_like(k)
    gb = 2 * k.numel() * 2 / 1e9
    fns = {"flashlib": lambda: flash_decode(q, k, v), "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv)}
    for name, fn in fns.items():
        fn(); torch.cuda.synchronize()
        # eager, events around each call, synced
        ts = []
        for _ in range(10):
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
        eager = statistics.median(ts)
        # eager, 10 back to back
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(10): fn()
        e.record(); torch.cuda.synchronize(); b2b = s.elapsed_time(e) / 10
        # graph of one call
        side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side): fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g): fn()
        g.replay(); torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record(); g.replay(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
        graph = statistics.median(ts)
        # graph of 10 calls
        g10 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g10):
            for _ in range(10): fn()
        g10.replay(); torch.cuda.synchronize()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); g10.replay(); e.record(); torch.cuda.synchronize(); g10t = s.elapsed_time(e) / 10
        print(f"B={B} Hkv={Hkv} L={L} {name:8s} TB/s: eager-synced {gb/eager:.2f}  eager-b2b {gb/b2b:.2f}  graph1 {gb/graph:.2f}  graph10 {gb/g10t:.2f}", flush=True)
        del g, g10
