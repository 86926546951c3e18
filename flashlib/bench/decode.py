"""Decode benchmark suite: ``python -m flashlib.bench --suite decode``, TB/s of K/V cache read.

Decoding one token per sequence does 4 * Hq * L * D FLOPs per sequence over 2 * Hkv * L * D cache
elements: about one FLOP per byte (Hq / Hkv with grouped heads), far left of any GPU's ridge point,
so the figure of merit is bandwidth: the bytes of K and V that attention must read,
2 * Hkv * sum(L) * D * elem_bytes, over the time. The ceiling is the device's copy bandwidth,
measured in the same run (a large tensor's ``copy_``, bytes read + written, ``env["copy_gbps"]``).

Cases (float16, head dim 128, one new token): B=1 H=32 (multi-head) and B=8 Hq=32 Hkv=8 (grouped)
at L = 1k .. 128k, and a ragged batch (B=8 grouped, lengths 1k .. 100k). Implementations:
``flashlib.flash_decode``; SDPA with the flash and cuDNN backends forced; FlexAttention
(torch.compile'd); a naive matmul decode (scores, softmax, matmul in the inputs' dtype). SDPA has
no per-sequence lengths: in the ragged case its backends run one call per sequence. As in
``flashlib.bench``, every implementation is first checked against ``attention_ref`` (float64,
the lengths as a mask) on a slice of the very inputs it is timed on; a wrong one is not timed.

Two times per implementation. ``ms``: ``bench.time_ms`` (do_bench, eager, L2 flushed before each
call), as every suite; a call whose host-side work (Python, launches) outlasts the GPU's shows
that cost. ``ms_graph``: the same call replayed from a CUDA graph (how serving engines run decode
steps) over enough copies of the inputs that every call reads from HBM: GPU time only.

Records follow ``flashlib.bench``'s format with op "decode": Nq = new tokens, Nk = Lmax,
density = sum(L) / (B * Lmax), gbps = K/V bytes read / ms, tflops = 4 B Hq Nq Nk D density / ms;
plus gbps_graph, ratio_vs_sdpa_cudnn, copy_fraction (and each with _graph), host_us (host time
per call, ``host_time``), seqlens (ragged), num_splits and config (flashlib).
``flashlib.bench.decode_tuning`` times the partial kernel's configs against split counts (graph
times), to tune ``kernels.decode`` on another GPU, and splits one call's host time by part.
"""
import functools
import json
import math

import torch
import torch.nn.functional as F

from .. import runtime
from . import harness as bench
from ..decode import flash_decode
from ..kernels import decode as kernels
from ..reference import attention_ref
from ..testing import max_error, tolerance

LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
QUICK_LENGTHS = [4096, 32768]
MHA = dict(B=1, Hq=32, Hkv=32, D=128)
GQA = dict(B=8, Hq=32, Hkv=8, D=128)
RAGGED = [1000, 3000, 7000, 15000, 31000, 50000, 75000, 100000]   # B=8 grouped; Lmax 100000
IMPLS = ["flashlib", "sdpa_flash", "sdpa_cudnn", "flex", "naive"]


def kv_bytes(shape, seqlens, elem_bytes):
    """Bytes of K and V the attention must read: 2 * Hkv * sum(L) * D * elem_bytes."""
    return 2 * shape["Hkv"] * sum(seqlens) * shape["D"] * elem_bytes


@functools.lru_cache(maxsize=64)
def device_lengths(seqlens: tuple, device):
    """The lengths as an int32 tensor on ``device``, made once: a host-to-device copy inside a
    timed call would wait for the GPU (pageable memory) and put launch latency into the time."""
    return torch.tensor(seqlens, dtype=torch.int32, device=device)


def length_mask(seqlens, Nq, Lmax, device):
    """(B, 1, Nq, Lmax) bool: new token i of sequence b sees j iff j <= i + L_b - Nq."""
    lens = device_lengths(tuple(seqlens), device)[:, None, None, None]
    i = torch.arange(Nq, device=device)[None, None, :, None]
    j = torch.arange(Lmax, device=device)[None, None, None, :]
    return j <= i + lens - Nq


def naive_decode(q, k, v, seqlens):
    """Scores, softmax, matmul in the inputs' dtype; grouped heads by reshaping q, not copying K/V."""
    B, Hq, Nq, D = q.shape
    Hkv, Lmax = k.shape[1], k.shape[2]
    qg = q.reshape(B, Hkv, Hq // Hkv * Nq, D)                        # (B, Hkv, G*Nq, D)
    s = torch.matmul(qg, k.transpose(-1, -2)) / math.sqrt(D)         # (B, Hkv, G*Nq, Lmax)
    if seqlens is not None:
        mask = length_mask(seqlens, Nq, Lmax, q.device).repeat(1, 1, Hq // Hkv, 1)
        s = s.masked_fill(~mask, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.matmul(p, v).reshape(B, Hq, Nq, D)


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def one(q, k, v):
        with sdpa_kernel([chosen]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])

    def run(q, k, v, seqlens):
        if seqlens is None:
            return one(q, k, v)
        # no per-sequence lengths in SDPA: one call per sequence over its valid keys
        return torch.cat([one(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n])
                          for b, n in enumerate(seqlens)])
    return run


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 256   # one graph per shape (see flashlib.bench)
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def run(q, k, v, seqlens):
        block_mask = None
        if seqlens is not None:
            key = (tuple(seqlens), q.shape[2], k.shape[2])
            if key not in masks:
                lens = device_lengths(tuple(seqlens), q.device)
                masks[key] = create_block_mask(lambda b, h, i, j: j < lens[b], len(seqlens), None,
                                               q.shape[2], k.shape[2], device=q.device)
            block_mask = masks[key]
        return compiled(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
    return run


def implementations(names=None):
    def flashlib(q, k, v, seqlens):
        lens = None if seqlens is None else device_lengths(tuple(seqlens), q.device)
        return flash_decode(q, k, v, cache_seqlens=lens)

    impls = {"flashlib": flashlib, "naive": naive_decode}
    if runtime.DEVICE.type == "cuda":
        impls["sdpa_flash"], impls["sdpa_cudnn"] = _sdpa("sdpa_flash"), _sdpa("sdpa_cudnn")
        try:
            impls["flex"] = _flex()
        except Exception:  # FlexAttention needs torch >= 2.5
            pass
    return {n: impls[n] for n in IMPLS if n in impls and (names is None or n in names)}


def check_decode(fn, q, k, v, seqlens):
    """Error of ``fn`` on all sequences and one or two K/V heads (with their query heads) against
    attention_ref with the lengths as a mask, and whether it is within the tolerance rule."""
    group = q.shape[1] // k.shape[1]
    hkv = 1 if group > 1 else 2
    qs, ks, vs = q[:, :hkv * group], k[:, :hkv], v[:, :hkv]
    Nq, Lmax = q.shape[2], k.shape[2]
    lens = [Lmax] * q.shape[0] if seqlens is None else seqlens
    out = fn(qs, ks, vs, seqlens)
    ref, _ = attention_ref(qs, ks, vs, mask=length_mask(lens, Nq, Lmax, q.device))
    err, tol = max_error(out, ref), tolerance(ref, naive_decode(qs, ks, vs, lens), q.dtype)
    return err, err <= tol


def run_case(name, fn, shape, seqlens, dtype, *, ragged):
    """Check, then time one implementation on one case; returns its record (bench's format)."""
    B, Hq, Hkv, D, Nq = shape["B"], shape["Hq"], shape["Hkv"], shape["D"], 1
    Lmax = max(seqlens)
    density = sum(seqlens) / (B * Lmax)
    rec = dict(op="decode", impl=name, dtype=str(dtype).replace("torch.", ""), B=B, Hq=Hq, Hkv=Hkv,
               Nq=Nq, Nk=Lmax, D=D, causal=False, density=density, ms=None, tflops=None,
               gbps=None, peak_mem_gb=None, ratio_vs_sdpa_flash=None, ms_graph=None, gbps_graph=None)
    if ragged:
        rec["seqlens"] = list(seqlens)
    note = None
    try:
        q, _, _ = bench.make_inputs(B, Hq, Hkv, Nq, 1, D, dtype, runtime.DEVICE)
        _, k, v = bench.make_inputs(B, 1, Hkv, 1, Lmax, D, dtype, runtime.DEVICE)
        lens = list(seqlens) if ragged else None
        err, ok = check_decode(fn, q, k, v, lens)
        note = None if ok else f"wrong: max error {err:.3g} over tolerance"
        if ok:
            torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                ms = bench.time_ms(lambda: fn(q, k, v, lens))
            rec.update(ms=ms, peak_mem_gb=round(torch.cuda.max_memory_allocated() / 1e9, 3),
                       gbps=kv_bytes(shape, seqlens, dtype.itemsize) / ms / 1e6,
                       tflops=4 * B * Hq * Nq * Lmax * D * rec["density"] / ms / 1e9)
            rec["host_us"] = host_time(lambda: fn(q, k, v, lens))
            try:
                ms_graph = graph_time(fn, q, k, v, lens)
                rec.update(ms_graph=ms_graph,
                           gbps_graph=kv_bytes(shape, seqlens, dtype.itemsize) / ms_graph / 1e6)
            except Exception as e:  # e.g. a compiled function that cannot be captured
                rec["note_graph"] = f"no graph time: {type(e).__name__}: {str(e)[:120]}"
            if name == "flashlib":   # the heuristic's choice
                _, _, config, rec["num_splits"] = kernels.launch_plan(q, k, lens)
                rec["config"] = list(config)
    except torch.cuda.OutOfMemoryError:
        note = "out of memory"
    except Exception as e:  # a backend that refuses this shape
        note = f"unsupported: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    if note:
        rec["note"] = note
    torch.cuda.empty_cache()
    return rec


def host_time(fn, *, calls=200, repeats=3, grad=False):
    """Microseconds of host (Python, launch) time per call: ``calls`` calls back to back without
    a sync, best of ``repeats``, autograd off unless ``grad``. When it exceeds the GPU time, eager
    decoding is host-bound."""
    import time
    best = math.inf
    with torch.set_grad_enabled(grad):
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, time.perf_counter() - start)
            torch.cuda.synchronize()
    return round(best / calls * 1e6, 1)


def graph_time(fn, q, k, v, lens, *, cold_bytes=4e8, warmup_ms=25, rep_ms=100):
    """Milliseconds per call of ``fn(q, k, v, lens)`` replayed from one CUDA graph: GPU time, no
    host overhead. The graph calls fn on ``sets`` copies of the inputs in turn (at least
    ``cold_bytes`` of cache in all, 8x an H100's L2), so each call reads its cache from HBM.
    As do_bench does, replays run for ``warmup_ms`` untimed, then the median of replays filling
    ``rep_ms`` (at least 10). Without the warm-up, ten timed replays of a graph captured after
    the suite's correctness check (``check_decode``) read B=8 Hkv=8 at 32k-128k keys 11-13% slow
    on an H200, every implementation alike (benchmarks/probes/decode_graph_probe.py --order)."""
    import statistics
    sets = max(1, min(32, math.ceil(cold_bytes / ((k.numel() + v.numel()) * k.element_size()))))
    inputs = [(q, k, v)] + [tuple(torch.randn_like(t) for t in (q, k, v)) for _ in range(sets - 1)]
    calls = [functools.partial(fn, *x, lens) for x in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():    # warm up off the default stream, as
        for call in calls:                              # torch.cuda.graph's docs ask
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        for call in calls:
            call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    for _ in range(int(warmup_ms / once)):
        graph.replay()
    times = []
    for _ in range(max(10, int(rep_ms / once))):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / sets)
    del graph, inputs, calls
    return statistics.median(times)


def copy_bandwidth(dtype, gigabytes=2):
    """GB/s of a large device-to-device ``copy_``, counting bytes read plus bytes written."""
    x = torch.randn(int(gigabytes * 1e9) // dtype.itemsize, device=runtime.DEVICE).to(dtype)
    y = torch.empty_like(x)
    ms = bench.time_ms(lambda: y.copy_(x))
    gbps = 2 * x.numel() * x.element_size() / ms / 1e6
    del x, y
    torch.cuda.empty_cache()
    return gbps


def cases(quick=False):
    """(label, shape, seqlens, ragged) for the suite."""
    lengths = QUICK_LENGTHS if quick else LENGTHS
    out = [("mha", MHA, [L] * MHA["B"], False) for L in lengths]
    out += [("gqa", GQA, [L] * GQA["B"], False) for L in lengths]
    out.append(("ragged", GQA, RAGGED, True))
    return out


def add_decode_ratios(records, copy_gbps):
    """ratio_vs_sdpa_flash (bench.add_ratios), ratio_vs_sdpa_cudnn, copy_fraction; the same three
    with a _graph suffix from the graph times."""
    bench.add_ratios(records)
    key = lambda r: (r["B"], r["Hq"], r["Hkv"], r["Nq"], r["Nk"], r["D"], r["dtype"])  # noqa: E731
    for suffix in ("", "_graph"):
        ms = "ms" + suffix
        base = {(r["impl"], key(r)): r[ms] for r in records if r.get(ms)}
        for r in records:
            for impl in ("sdpa_flash", "sdpa_cudnn") if suffix else ("sdpa_cudnn",):
                theirs = base.get((impl, key(r)))
                r[f"ratio_vs_{impl}{suffix}"] = round(theirs / r[ms], 3) if theirs and r.get(ms) else None
            gbps = r.get("gbps" + suffix)
            r["copy_fraction" + suffix] = round(gbps / copy_gbps, 3) if gbps else None
    return records


def run_suite(dtype, out_dir, *, names=None, quick=False):
    """Run the decode suite; write decode_<dtype>.json and .png to out_dir; print a table."""
    from tqdm.auto import tqdm
    impls = implementations(names)
    copy_gbps = copy_bandwidth(dtype)
    records = []
    # torch.compile'd FlexAttention last: its compile leaves worker processes and threads behind,
    # and the host-bound rows of every implementation timed after it ran slower (bench notes)
    work = sorted(((c, n) for c in cases(quick) for n in impls), key=lambda w: w[1] == "flex")
    for (label, shape, seqlens, ragged), name in tqdm(work, desc="decode"):
        records.append(run_case(name, impls[name], shape, seqlens, dtype, ragged=ragged))
    add_decode_ratios(records, copy_gbps)
    stem = f"decode_{str(dtype).replace('torch.', '')}"
    env = dict(bench.environment(), copy_gbps=round(copy_gbps, 1))
    (out_dir / f"{stem}.json").write_text(json.dumps(dict(env=env, records=records), indent=1))
    plot(records, copy_gbps, out_dir / f"{stem}.png", f"decode {stem[7:]}, {env['gpu']}")
    print_table(records, copy_gbps)
    return records


def _label(r):
    return "ragged" if "seqlens" in r else ("mha" if r["Hq"] == r["Hkv"] else "gqa")


def plot(records, copy_gbps, path, title):
    """TB/s against L (log2) for the multi-head and grouped cases, bars for the ragged batch; top
    row the eager times (do_bench), bottom row the CUDA-graph times (GPU only)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(16, 9), gridspec_kw=dict(width_ratios=[3, 3, 2]))
    impls = list(dict.fromkeys(r["impl"] for r in records))
    for row, (suffix, how) in zip(axes, (("", "eager, do_bench"), ("_graph", "CUDA graph"))):
        for ax, label, name in zip(row, ("mha", "gqa"), ("B=1 H=32 d=128", "B=8 Hq=32 Hkv=8 d=128")):
            for impl in impls:
                pts = [(r["Nk"], r["gbps" + suffix] / 1e3) for r in records
                       if r["impl"] == impl and _label(r) == label and r.get("gbps" + suffix)]
                if pts:
                    ax.plot(*zip(*pts), "o-", label=impl)
            ax.axhline(copy_gbps / 1e3, color="gray", ls="--", label="device copy")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("cache length L")
            ax.set_ylabel("K/V read, TB/s")
            ax.set_title(f"{name} ({how})")
            ax.legend(fontsize=8)
        ragged = [r for r in records if _label(r) == "ragged"]
        row[2].bar(range(len(ragged)), [(r.get("gbps" + suffix) or 0) / 1e3 for r in ragged],
                   tick_label=[r["impl"] for r in ragged])
        row[2].axhline(copy_gbps / 1e3, color="gray", ls="--")
        row[2].set_title(f"ragged B=8 GQA, L 1k..100k ({how})")
        row[2].tick_params(axis="x", rotation=30)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_table(records, copy_gbps):
    print(f"device copy: {copy_gbps / 1e3:.2f} TB/s (read + write)")
    for suffix, how in (("", "eager (do_bench)"), ("_graph", "CUDA graph (GPU time)")):
        print(f"\n{how}: TB/s of K/V read; flashlib's ratios")
        print(f"{'case':8}{'L':>7}" + "".join(f"{i:>11}" for i in IMPLS) +
              f"{'/flash':>8}{'/cudnn':>8}{'of copy':>8}")
        rows = {}
        for r in records:
            rows.setdefault((_label(r), r["Nk"]), {})[r["impl"]] = r
        fmt = lambda x, w: f"{'-':>{w}}" if x is None else f"{x:>{w}.2f}"  # noqa: E731
        for (label, L), row in rows.items():
            cells = "".join(fmt(row[i].get("gbps" + suffix) and row[i]["gbps" + suffix] / 1e3, 11)
                            if i in row else f"{'-':>11}" for i in IMPLS)
            mine = row.get("flashlib", {})
            ratios = "".join(fmt(mine.get(name + suffix), 8) for name in
                             ("ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn", "copy_fraction"))
            print(f"{label:8}{L:>7}{cells}{ratios}")
    print(f"\nhost time per call, microseconds\n{'case':8}{'L':>7}" + "".join(f"{i:>11}" for i in IMPLS))
    for (label, L), row in rows.items():
        print(f"{label:8}{L:>7}" + "".join(fmt(row[i].get("host_us"), 11) if i in row
                                           else f"{'-':>11}" for i in IMPLS))
    for r in records:
        for note in ("note", "note_graph"):
            if r.get(note):
                print(f"  {r['impl']} {_label(r)} L={r['Nk']}: {r[note]}")
