"""Benchmark harness: flashlib against PyTorch's attention kernels, checked before it is timed.

``python -m flashlib.bench [--suite forward backward paper memory block_sparse decode] [--quick]``
on a CUDA GPU (``block_sparse``: see ``flashlib.bench.sparse``; ``decode``: ``flashlib.bench.decode``):
1. every implementation is checked against ``attention_ref`` (float64) on a slice of the very
   inputs it is timed on, with the tolerance rule of ``flashlib.testing``; a wrong one is
   reported and not timed;
2. each is timed with ``triton.testing.do_bench`` (median, CUDA events);
3. records go to ``benchmarks/results/<gpu>/<suite>.json`` with a PNG beside: ``env`` (gpu, sm
   count, torch, triton, cuda, date) and ``records``, one flat object per (implementation, shape):
   op, impl, dtype, B, Hq, Hkv, Nq, Nk, D, causal, density, ms, tflops, gbps, peak_mem_gb and
   ratio_vs_sdpa_flash (SDPA flash's time over this one's, same op and shape, same run).

Implementations: flashlib; SDPA with each backend forced (flash, cudnn, efficient); naive PyTorch
(materialises the N x N scores); FlexAttention (torch.compile'd) where it imports.
FLOPs: 4 * B * Hq * Nq * Nk * D for the forward (halved for causal), 2.5x that for the backward.
"""
import datetime
import os

import torch
import torch.nn.functional as F

from .. import runtime
from ..kernels.dispatch import attention_flops
from ..ops import flash_attention
from ..reference import attention_naive, attention_ref
from ..testing import tolerance, max_error

# (D, N, causal) with batch x seqlen = 32k tokens and heads x headdim = 2048
FORWARD_SHAPES = [(64, 4096, False), (64, 16384, False), (64, 4096, True),
                  (128, 4096, False), (128, 16384, False), (128, 16384, True)]
PAPER_SHAPE = dict(B=64, H=16, N=1024, D=64)     # FlashAttention paper, fwd + bwd


def shape_for(D, N, *, tokens=32768, width=2048):
    return dict(B=max(1, tokens // N), Hq=width // D, Hkv=width // D, Nq=N, Nk=N, D=D)


def sdpa(backend):
    """SDPA restricted to ``backend`` ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"), as an
    implementation ``fn(q, k, v, causal)``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
              "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def run(q, k, v, causal):
        with sdpa_kernel([chosen]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    return run


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch._dynamo
    # one compiled graph per shape, grad mode and causal flag: the default limit of 8 recompiles
    # would silently fall back to the unfused (N^2 memory) implementation mid-benchmark
    torch._dynamo.config.cache_size_limit = 256
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def run(q, k, v, causal):
        block_mask = None
        if causal:
            key = (q.shape[2], k.shape[2])
            if key not in masks:
                off = k.shape[2] - q.shape[2]
                masks[key] = create_block_mask(lambda b, h, i, j: j <= i + off, None, None,
                                               q.shape[2], k.shape[2], device=q.device)
            block_mask = masks[key]
        return compiled(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
    return run


def implementations(names=None):
    impls = {"flashlib": lambda q, k, v, causal: flash_attention(q, k, v, causal=causal),
             "naive": lambda q, k, v, causal: attention_naive(q, k, v, causal=causal)}
    if runtime.DEVICE.type == "cuda":
        for b in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
            impls[b] = sdpa(b)
        try:
            impls["flex"] = _flex()
        except Exception:  # FlexAttention needs torch >= 2.5
            pass
    return {n: f for n, f in impls.items() if names is None or n in names}


def make_inputs(B, Hq, Hkv, Nq, Nk, D, dtype, device, requires_grad=False):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, Hq, Nq, D, dtype=dtype, device=device, generator=g)
    k = torch.randn(B, Hkv, Nk, D, dtype=dtype, device=device, generator=g)
    v = torch.randn(B, Hkv, Nk, D, dtype=dtype, device=device, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def check(fn, q, k, v, causal, *, heads=2):
    """Error of ``fn`` on the first batch element and ``heads`` heads, and whether it passes."""
    group = q.shape[1] // k.shape[1]
    hq = min(heads, q.shape[1])
    hkv = max(1, hq // group)
    qs, ks, vs = (t[:1, :h].detach() for t, h in ((q, hq), (k, hkv), (v, hkv)))
    out = fn(qs, ks, vs, causal)
    ref, _ = attention_ref(qs, ks, vs, causal=causal)
    base = attention_naive(qs, ks, vs, causal=causal)
    err, tol = max_error(out, ref), tolerance(ref, base, q.dtype)
    return err, err <= tol


def time_ms(fn):
    """``fn``'s median time in ms (``triton.testing.do_bench``, the suites' one timer)."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def run_case(name, fn, shape, causal, dtype, ops):
    """Check, then time the requested ops; returns records (ms None with a note on failure)."""
    B, Hq, Nq, Nk, D = shape["B"], shape["Hq"], shape["Nq"], shape["Nk"], shape["D"]
    flops = attention_flops(B, Hq, Nq, Nk, D, causal=causal)
    scale = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
    base = dict(dtype=str(dtype).replace("torch.", ""), B=B, Hq=Hq, Hkv=shape["Hkv"], Nq=Nq, Nk=Nk,
                D=D, causal=causal, density=1.0, gbps=None, peak_mem_gb=None)
    records = []
    try:
        q, k, v = make_inputs(B, Hq, shape["Hkv"], Nq, Nk, D, dtype, runtime.DEVICE, requires_grad=True)
        err, ok = check(fn, q, k, v, causal)
        note = None if ok else f"wrong: max error {err:.3g} over tolerance"
    except torch.cuda.OutOfMemoryError:
        note = "out of memory"
    except Exception as e:  # a backend that refuses this shape (e.g. cuDNN on an old GPU)
        note = f"unsupported: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    for op in ops:
        ms = None
        if note is None:
            try:
                torch.cuda.reset_peak_memory_stats()
                if op == "fwd":
                    with torch.no_grad():
                        ms = time_ms(lambda: fn(q, k, v, causal))
                else:
                    out = fn(q, k, v, causal)
                    dout = torch.randn_like(out)
                    if op == "bwd":
                        ms = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
                    else:
                        ms = time_ms(lambda: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout))
                    del out
                peak = torch.cuda.max_memory_allocated() / 1e9
            except torch.cuda.OutOfMemoryError:
                note = "out of memory"
            except Exception as e:
                note = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        rec = dict(op=op, impl=name, **base, ms=ms,
                   tflops=None if ms is None else flops * scale[op] / ms / 1e9,
                   ratio_vs_sdpa_flash=None)
        if ms is not None:
            rec["peak_mem_gb"] = round(peak, 3)
        if note:
            rec["note"] = note
        records.append(rec)
    torch.cuda.empty_cache()
    return records


def add_ratios(records, baseline="sdpa_flash"):
    """``ratio_vs_<baseline>``: that implementation's time over this record's, same op and shape
    (set only where both have a time)."""
    key = lambda r: (r["op"], r["dtype"], r["B"], r["Hq"], r["Hkv"], r["Nq"], r["Nk"], r["D"], r["causal"])
    times = {key(r): r["ms"] for r in records if r["impl"] == baseline and r["ms"]}
    for r in records:
        if r["ms"] and key(r) in times:
            r[f"ratio_vs_{baseline}"] = round(times[key(r)] / r["ms"], 3)
    return records


def environment():
    """The run's machine and software; on a CPU (the model suite's --tiny) gpu "cpu", no sm count.
    autotune: whether the kernels autotune (on a GPU unless FLASHLIB_AUTOTUNE=0)."""
    props = torch.cuda.get_device_properties(0) if runtime.DEVICE.type == "cuda" else None
    import triton
    return dict(gpu="cpu" if props is None else props.name,
                sm_count=None if props is None else props.multi_processor_count, torch=torch.__version__,
                triton=triton.__version__, cuda=torch.version.cuda,
                autotune=runtime.DEVICE.type == "cuda" and os.environ.get("FLASHLIB_AUTOTUNE", "1") != "0",
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def suite_cases(suite, quick):
    """(impl names, shape, causal, ops) for each case of a suite."""
    shapes = FORWARD_SHAPES[:1] + FORWARD_SHAPES[2:4] if quick else FORWARD_SHAPES
    everything = ["flashlib", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "naive"]
    if suite == "forward":
        return [(everything, shape_for(D, N), c, ["fwd"]) for D, N, c in shapes]
    if suite == "backward":
        return [(everything, shape_for(D, N), c, ["bwd", "fwd_bwd"]) for D, N, c in shapes]
    if suite == "paper":
        p = PAPER_SHAPE
        return [(["flashlib", "sdpa_flash", "naive"],
                 dict(B=p["B"], Hq=p["H"], Hkv=p["H"], Nq=p["N"], Nk=p["N"], D=p["D"]), False, ["fwd_bwd"])]
    if suite == "memory":
        return [(["flashlib", "naive"], dict(B=1, Hq=16, Hkv=16, Nq=n, Nk=n, D=64), False, ["fwd_bwd"])
                for n in (1024, 2048, 4096, 8192, 16384, 32768)]
    raise ValueError(f"unknown suite {suite!r}")


def plot(records, path, title, *, value="tflops", ylabel="TFLOP/s", label=None, impl_label=None):
    """Bars of ``value`` (TFLOP/s by default) per shape and implementation, one panel per op.
    label(record): the shape's name under its bars; impl_label(record): the legend's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    label = label or (lambda r: f"d{r['D']} N{r['Nq']}{' causal' if r['causal'] else ''}")
    impl_label = impl_label or (lambda r: r["impl"])
    ops = sorted({r["op"] for r in records})
    fig, axes = plt.subplots(1, len(ops), figsize=(7 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rs = [r for r in records if r["op"] == op]
        labels = list(dict.fromkeys(label(r) for r in rs))
        impls = list(dict.fromkeys(r["impl"] for r in rs))
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            mine = [r for r in rs if r["impl"] == impl]
            values = {label(r): r[value] or 0 for r in mine}
            ax.bar([x + i * width for x in range(len(labels))], [values.get(lab, 0) for lab in labels],
                   width, label=impl_label(mine[0]))
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels, rotation=20)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {op}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(records, path, title):
    """Peak memory against sequence length, log-log: O(N) for flashlib, O(N^2) for naive."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for impl in dict.fromkeys(r["impl"] for r in records):
        pts = [(r["Nq"], r["peak_mem_gb"]) for r in records if r["impl"] == impl and r["peak_mem_gb"]]
        ax.plot(*zip(*pts), "o-", label=impl)
        lost = [r["Nq"] for r in records if r["impl"] == impl and r.get("note") == "out of memory"]
        if lost:
            ax.annotate("out of memory", (lost[0], pts[-1][1]), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak GPU memory, forward + backward (GB)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(records):
    print(f"{'op':8}{'impl':16}{'shape':28}{'ms':>9}{'TFLOP/s':>9}{'vs flash':>9}{'GB':>7}  note")
    for r in records:
        shape = f"B{r['B']} H{r['Hq']} N{r['Nq']} d{r['D']}{' c' if r['causal'] else ''}"
        fmt = lambda x, f: "-" if x is None else format(x, f)
        print(f"{r['op']:8}{r['impl']:16}{shape:28}{fmt(r['ms'], '9.3f')}{fmt(r['tflops'], '9.1f')}"
              f"{fmt(r['ratio_vs_sdpa_flash'], '9.2f')}{fmt(r['peak_mem_gb'], '7.2f')}  {r.get('note', '')}")

