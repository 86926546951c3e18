"""The short suite: eager forward+backward of GPT-sized attention, where host time decides.

A small GPT calls attention dozens of times per training step, at a few hundred to a few
thousand tokens, where each call's kernels take tens of microseconds: what the Python around them
costs (checks, autograd, launching) is as large as the GPU's work. This suite times what such a
model's user gets, against what PyTorch gives them by default:

- shapes: causal, B x N = 16k tokens, N = 128 ... 4096, at H=12 d=64 (GPT-2 small) and H=16
  d=128; records ``op: "fwd_bwd"`` in the harness's format (``torch.autograd.grad`` of a fresh
  forward, the CUDA events' median of ``do_bench``: wall time when the host is the bottleneck);
- implementations: ``flashlib``, ``sdpa_default`` (``F.scaled_dot_product_attention`` with no
  backend forced: cuDNN or flash, whatever PyTorch picks) and ``sdpa_flash``;
- ``host_us`` beside each: microseconds of host time per forward+backward, from calls that never
  wait for the GPU (``decode.host_time``; at long N the GPU's queue can hold it back, so it is an
  upper bound there), and, once per run, flashlib's per-launch host time: the forward launcher
  (one kernel) and the backward's (two) at the smallest shape's length, one (batch, head), over
  calls that replay a plan.

``python -m flashlib.bench --suite short [--dtype bfloat16]``; the JSON holds ``env``, ``records``
and ``launch_host_us``.
"""
import torch
import torch.nn.functional as F

from .decode import host_time
from .harness import sdpa, check, flash_attention, make_inputs, run_case, shape_for
from .harness import add_ratios as harness_ratios   # one baseline at a time

LENGTHS = (128, 256, 512, 1024, 2048, 4096)
WIDTHS = ((64, 768), (128, 2048))          # (head dim, heads x head dim)
IMPLS = ("flashlib", "sdpa_default", "sdpa_flash")


def _sdpa_default(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def implementations():
    return {"flashlib": lambda q, k, v, causal: flash_attention(q, k, v, causal=causal),
            "sdpa_default": _sdpa_default, "sdpa_flash": sdpa("sdpa_flash")}


def cases(quick=False):
    lengths = LENGTHS[:2] + LENGTHS[3:4] if quick else LENGTHS
    return [shape_for(D, N, tokens=16384, width=width) for D, width in WIDTHS for N in lengths]


def run_suite(dtype, *, quick=False, impls=None, progress=lambda x, **_: x):
    """Records of every (implementation, shape), each with ``host_us``, and flashlib's launch
    host times {"forward launcher (1 kernel)": us, "backward launcher (2 kernels)": us}."""
    chosen = {n: f for n, f in implementations().items() if impls is None or n in impls}
    records = []
    for shape in progress(cases(quick), desc="short"):
        for name, fn in chosen.items():
            rec, = run_case(name, fn, shape, True, dtype, ["fwd_bwd"])
            rec["host_us"] = None
            if rec["ms"] is not None:
                q, k, v = make_inputs(shape["B"], shape["Hq"], shape["Hkv"], shape["Nq"], shape["Nk"],
                                      shape["D"], dtype, "cuda", requires_grad=True)
                dout = torch.randn_like(q)
                rec["host_us"] = host_time(
                    lambda: torch.autograd.grad(fn(q, k, v, True), (q, k, v), dout),
                    calls=50, repeats=5, grad=True)
            records.append(rec)
    add_ratios(records)
    return records, launch_host_us(cases(quick)[0], dtype) if "flashlib" in chosen else {}


def add_ratios(records):
    """``ratio_vs_sdpa_default`` and ``ratio_vs_sdpa_flash``: that implementation's time over
    this one's, same shape, same run (None where either has no time)."""
    for r in records:
        r["ratio_vs_sdpa_default"] = r["ratio_vs_sdpa_flash"] = None
    for baseline in ("sdpa_default", "sdpa_flash"):
        harness_ratios(records, baseline)
    return records


def launch_host_us(shape, dtype):
    """flashlib's launchers alone, on a plan they replay: host microseconds per call, at one
    (batch, head) of ``shape`` (N = 128: kernels of a few microseconds) and in loops of 100 calls,
    fewer launches than the GPU's queue holds, so that no call waits for the GPU (at the suite's
    full shapes the backward's kernels outlast its launches and the loop would time the GPU)."""
    from ..kernels.fa2_bwd import fa2_backward
    from ..kernels.fa2_fwd import fa2_forward
    q, k, v = make_inputs(1, 1, 1, shape["Nq"], shape["Nk"], shape["D"], dtype, "cuda")
    out, lse = fa2_forward(q, k, v, causal=True)
    dout = torch.randn_like(out)
    err, ok = check(lambda *a: fa2_forward(*a[:3], causal=True)[0], q, k, v, True, heads=1)
    assert ok, f"fa2_forward wrong before timing its launches: max error {err:.3g}"
    fa2_backward(q, k, v, out, lse, dout, causal=True)
    return {"forward launcher (1 kernel)": host_time(lambda: fa2_forward(q, k, v, causal=True),
                                                      calls=100, repeats=7),
            "backward launcher (2 kernels)": host_time(
                lambda: fa2_backward(q, k, v, out, lse, dout, causal=True), calls=100, repeats=7)}


def print_table(records, launches):
    print(f"{'impl':14}{'shape':26}{'ms':>9}{'host us':>9}{'vs default':>11}{'vs flash':>9}  note")
    for r in records:
        shape = f"B{r['B']} H{r['Hq']} N{r['Nq']} d{r['D']}"
        fmt = lambda x, f: "-" if x is None else format(x, f)   # noqa: E731
        print(f"{r['impl']:14}{shape:26}{fmt(r['ms'], '9.3f')}{fmt(r.get('host_us'), '9.1f')}"
              f"{fmt(r.get('ratio_vs_sdpa_default'), '11.2f')}{fmt(r.get('ratio_vs_sdpa_flash'), '9.2f')}"
              f"  {r.get('note', '')}")
    for name, us in launches.items():
        print(f"flashlib {name}: {us} us of host time per call")
