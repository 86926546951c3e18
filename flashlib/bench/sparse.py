"""Block-sparse benchmark suite: ``python -m flashlib.bench --suite block_sparse``.

Block-sparse attention should cost the dense time multiplied by the density s (the fraction of
non-empty blocks; FlashAttention paper, section 3.3). This suite measures that on one shape,
B=4, H=16, N=16k, d=64 (float16), over two families of masks:

- causal sliding windows W = 256 .. 4096 (s ~ W / N), the pattern of long-context models, and
- random block masks at s = 0.05 .. 1 (every visited block full: the kernel's best case).

Implementations, each checked first against ``attention_ref`` (float64) under the mask's dense
expansion on a slice of the very inputs it is timed on (a wrong one is not timed):
``flashlib`` (``block_sparse_attention``, the mask prebuilt); ``flex`` (FlexAttention,
torch.compile'd, the same rule as a ``mask_mod``, its block mask prebuilt); ``sdpa_mask`` (SDPA
with the dense boolean mask, whichever backend takes it). Per shape, dense ``flashlib_dense``
(``flash_attention``) and ``sdpa_flash`` give the dense times. Mask construction is not timed,
for flashlib or flex.

Records follow ``flashlib.bench``'s format with op "block_sparse_fwd" / "block_sparse_fwd_bwd",
``density`` = s, FLOPs = dense FLOPs x s; plus ``mask``, ``ratio_vs_flex`` (flex time / this
time) and, for flashlib, ``vs_density_x_dense`` = time / (s x flashlib's dense time), which the
design wants at or below 1.2. ``ratio_vs_sdpa_flash`` compares with dense SDPA flash.
"""
import torch
import torch.nn.functional as F

from .. import masks, runtime
from .harness import time_ms, attention_flops, make_inputs
from ..ops import block_sparse_attention, flash_attention
from ..reference import attention_naive, attention_ref
from ..testing import max_error, tolerance

SHAPE = dict(B=4, Hq=16, Hkv=16, Nq=16384, Nk=16384, D=64)
QUICK_SHAPE = dict(B=2, Hq=16, Hkv=16, Nq=8192, Nk=8192, D=64)
WINDOWS = [256, 1024, 4096]
DENSITIES = [0.05, 0.1, 0.25, 0.5, 1.0]
OPS = {"block_sparse_fwd": 1.0, "block_sparse_fwd_bwd": 3.5}   # FLOP multiples of the forward


def mask_cases(N, quick):
    """(label, flashlib BlockMask, flex mask_mod) per mask; the same rule both ways."""
    cases = []
    for w in (WINDOWS[1:2] if quick else WINDOWS):
        # the window as a tensor: torch.compile bakes a Python int into the first graph it
        # compiles and reuses that graph for the next window (a wrong answer, caught by the check)
        wt = torch.tensor(w, device=runtime.DEVICE)
        cases.append((f"window {w}", masks.sliding_window(N, N, w, device=runtime.DEVICE),
                      lambda b, h, i, j, wt=wt: (j <= i) & (j > i - wt)))
    for s in (DENSITIES[::2] if quick else DENSITIES):
        m = masks.random_blocks(N, N, s, device=runtime.DEVICE)
        blocks = (m.kinds[0, 0] != masks.EMPTY)                      # (nQ, nK) on the device
        cases.append((f"random {s:g}", m, lambda b, h, i, j, blocks=blocks: blocks[i // 128, j // 128]))
    return cases


def _flex_runner():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 256     # one graph per mask_mod and grad mode
    compiled = torch.compile(flex_attention, dynamic=False)

    def make(mask_mod, N):
        block_mask = create_block_mask(mask_mod, None, None, N, N, device=runtime.DEVICE)
        return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)
    return make


def _check(fn, q, k, v, dense):
    """Error on batch 0, two heads, against the float64 oracle under ``dense``; and pass/fail."""
    qs, ks, vs = (t[:1, :2].detach() for t in (q, k, v))
    out = fn(qs, ks, vs)
    ref, _ = attention_ref(qs, ks, vs, mask=dense)
    err = max_error(out, ref)
    return err, err <= tolerance(ref, attention_naive(qs, ks, vs, mask=dense), q.dtype)


def _measure(fn, q, k, v, dense, op):
    """Median ms of the forward, or of forward + backward; None and a note when it fails."""
    try:
        err, ok = _check(fn, q, k, v, dense)
        if not ok:
            return None, f"wrong: max error {err:.3g} over tolerance"
        if op == "block_sparse_fwd":
            with torch.no_grad():
                return time_ms(lambda: fn(q, k, v)), None
        dout = torch.randn_like(q)
        return time_ms(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout)), None
    except torch.cuda.OutOfMemoryError:
        return None, "out of memory"
    except Exception as e:  # a backend that refuses this case
        return None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"


def run_suite(dtype, *, quick=False, impls=None, progress=None):
    """Every record of the suite (see the module docstring)."""
    shape = QUICK_SHAPE if quick else SHAPE
    B, H, N, D = shape["B"], shape["Hq"], shape["Nq"], shape["D"]
    q, k, v = make_inputs(B, H, H, N, N, D, dtype, runtime.DEVICE, requires_grad=True)
    base = dict(dtype=str(dtype).replace("torch.", ""), B=B, Hq=H, Hkv=H, Nq=N, Nk=N, D=D,
                causal=False, gbps=None, peak_mem_gb=None)
    wanted = lambda name: impls is None or name in impls  # noqa: E731
    records, dense_ms = [], {}
    try:
        make_flex = _flex_runner() if wanted("flex") else None
    except Exception:  # FlexAttention needs torch >= 2.5
        make_flex = None

    def record(op, impl, label, density, ms, note):
        rec = dict(op=op, impl=impl, mask=label, **base, density=density, ms=ms,
                   tflops=None if ms is None else attention_flops(B, H, N, N, D) * density * OPS[op] / ms / 1e9,
                   ratio_vs_sdpa_flash=None, ratio_vs_flex=None)
        if note:
            rec["note"] = note
        records.append(rec)

    everything = torch.ones(1, 1, N, N, dtype=torch.bool, device=runtime.DEVICE)
    cases = mask_cases(N, quick)
    steps = [(op, None) for op in OPS] + [(op, case) for case in cases for op in OPS]
    for op, case in (progress(steps, desc="block_sparse") if progress else steps):
        if case is None:                                   # dense times of this shape
            for impl, fn in (("flashlib_dense", lambda q, k, v: flash_attention(q, k, v)),
                             ("sdpa_flash", _sdpa_flash)):
                if wanted(impl):
                    ms, note = _measure(fn, q, k, v, everything, op)
                    dense_ms[(impl, op)] = ms
                    record(op, impl, "dense", 1.0, ms, note)
            continue
        label, mask, mask_mod = case
        dense = mask.to_dense()
        runs = [("flashlib", lambda q, k, v, m=mask: block_sparse_attention(q, k, v, m)),
                ("sdpa_mask", lambda q, k, v, d=dense: F.scaled_dot_product_attention(q, k, v, attn_mask=d))]
        if make_flex is not None:
            runs.append(("flex", make_flex(mask_mod, N)))
        for impl, fn in runs:
            if wanted(impl):
                ms, note = _measure(fn, q, k, v, dense, op)
                record(op, impl, label, mask.density(), ms, note)
        if wanted("flashlib_dense_same_work"):
            # the dense kernel over as many key blocks per query block as the mask visits on
            # average: the per-program start-up and write-out costs at this much work, a floor
            # for the block-sparse time that does not depend on the mask
            n = max(1, round(mask.density() * mask.shape[3])) * mask.block_size
            first_n = (torch.arange(N, device=runtime.DEVICE) < n)[None, None, None, :]
            ms, note = _measure(lambda q, k, v: flash_attention(q, k[:, :, :n], v[:, :, :n]),
                                q, k, v, first_n, op)
            record(op, "flashlib_dense_same_work", label, n / N, ms, note)
        del dense
        torch.cuda.empty_cache()
    _add_ratios(records, dense_ms)
    return records


def _sdpa_flash(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v)


def _add_ratios(records, dense_ms):
    flex = {(r["op"], r["mask"]): r["ms"] for r in records if r["impl"] == "flex" and r["ms"]}
    for r in records:
        if not r["ms"]:
            continue
        if dense_ms.get(("sdpa_flash", r["op"])):
            r["ratio_vs_sdpa_flash"] = round(dense_ms[("sdpa_flash", r["op"])] / r["ms"], 3)
        if (r["op"], r["mask"]) in flex:
            r["ratio_vs_flex"] = round(flex[(r["op"], r["mask"])] / r["ms"], 3)
        if r["impl"] in ("flashlib", "flashlib_dense_same_work") and dense_ms.get(("flashlib_dense", r["op"])):
            r["vs_density_x_dense"] = round(r["ms"] / (r["density"] * dense_ms[("flashlib_dense", r["op"])]), 3)


def plot(records, path, title):
    """Time against density, log-log, one panel per op, the line s x dense time for reference."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = list(OPS)
    fig, axes = plt.subplots(1, len(ops), figsize=(6.5 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rs = [r for r in records if r["op"] == op and r["ms"]]
        for impl, marker in (("flashlib", "o"), ("flex", "s"), ("sdpa_mask", "^")):
            for family, style in (("window", "--"), ("random", "-")):
                pts = sorted((r["density"], r["ms"]) for r in rs
                             if r["impl"] == impl and r["mask"].startswith(family))
                if pts:
                    ax.plot(*zip(*pts), style, marker=marker, label=f"{impl}, {family}")
        dense = [r["ms"] for r in rs if r["impl"] == "flashlib_dense"]
        if dense:
            s = [min(r["density"] for r in rs), 1.0]
            ax.plot(s, [x * dense[0] for x in s], ":", color="grey", label="density x flashlib dense")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density s (fraction of blocks visited)")
        ax.set_ylabel("ms")
        ax.set_title(f"{title}: {op}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(records):
    print(f"{'op':22}{'impl':16}{'mask':14}{'s':>7}{'ms':>9}{'TFLOP/s':>9}{'vs flex':>8}{'t/(s*dense)':>12}  note")
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    for r in records:
        print(f"{r['op']:22}{r['impl']:16}{r['mask']:14}{r['density']:7.3f}{fmt(r['ms'], '9.3f')}"
              f"{fmt(r['tflops'], '9.1f')}{fmt(r['ratio_vs_flex'], '8.2f')}"
              f"{fmt(r.get('vs_density_x_dense'), '12.2f')}  {r.get('note', '')}")
