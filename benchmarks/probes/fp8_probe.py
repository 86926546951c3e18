"""Time the FP8 forward's variants (kernels/fa3_fwd.fa3_forward_fp8) beside SDPA cuDNN's fp16.

Each variant is first checked on the timed inputs' first batch element and two heads: its RMS
error against the float64 oracle on the dequantised inputs must be within 3x the P-rounding
model's (tests/test_fp8.py explains the model). Shapes: the forward suite's (fp16 inputs, then
quantised per (batch, kv-head)).

    FLASHLIB_AUTOTUNE=0 python benchmarks/probes/fp8_probe.py [--d 64 128] [--variants simple 2wg] > fp8_probe.log

--ab NAME=A,B times each variant with fa3_forward_fp8's keyword NAME set to each value in turn
(``--ab key_order=0,1``: V^T's keys in P's register order, ``_p_operand``, or not). --rounds N times every arm of a shape N times in turn (the median
printed, then each round).
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from test_fp8 import p_rounding_model, rms  # noqa: E402

from flashlib import fp8  # noqa: E402
from flashlib.bench.harness import FORWARD_SHAPES, make_inputs, sdpa, shape_for, time_ms  # noqa: E402
from flashlib.kernels import fa3_fwd  # noqa: E402
from flashlib.kernels.versions import attention_flops  # noqa: E402
from flashlib.reference import attention_ref  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
parser.add_argument("--variants", nargs="+", default=list(fa3_fwd.VARIANTS))
parser.add_argument("--ab", default=None, help="NAME=A,B: arms with fa3_forward_fp8(..., NAME=bool(A)), then B")
parser.add_argument("--rounds", type=int, default=1)
args = parser.parse_args()
print(f"{'shape':<24} {'impl':<30} {'ms':>7} {'TFLOP/s':>8} {'vs cuDNN':>8} {'rms err / model':>16}")
for D, N, causal in [shape for shape in FORWARD_SHAPES if shape[0] in args.d]:
    s = shape_for(D, N)
    B, H = s["B"], s["Hq"]
    q, k, v = make_inputs(B, H, H, N, N, D, torch.float16, "cuda")
    (q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(t, H) for t in (q, k, v))
    descale = torch.stack([qd, kd, vd])
    deq = [fp8.dequantize(a[:1, :2], b[:1, :2]) for a, b in ((q8, qd), (k8, kd), (v8, vd))]
    ref, _ = attention_ref(*deq, causal=causal)
    model = rms(p_rounding_model(*deq, causal=causal) - ref)
    flops = attention_flops(B, H, N, N, D, causal=causal)
    tag = f"B{B} H{H} N{N} d{D}{' c' if causal else ''}"
    cudnn = sdpa("sdpa_cudnn")
    times = {"cudnn fp16": (lambda: cudnn(q, k, v, causal), 0.0, [])}   # an arm of every round
    for name, variant in fa3_fwd.VARIANTS.items():
        if D not in variant.head_dims or name not in args.variants:
            continue
        flag, values = args.ab.split("=") if args.ab else ("key_order", None)
        arms = [(name, None)] if values is None else [(f"{name} {flag}={x}", int(x)) for x in values.split(",")]
        for label, value in arms:
            def run(value=value, name=name):
                chosen = {} if value is None else {flag: bool(value)}
                return fa3_fwd.fa3_forward_fp8(q8, k8, v8, descale, causal=causal, variant=name, **chosen)
            try:
                err = rms(run()[0][:1, :2].double() - ref) / model
            except ValueError as e:   # a variant the launcher refuses here (one consumer, causal)
                print(f"{tag:<24} {label:<30} refused: {str(e)[:60]}")
                continue
            times[label] = (run, err, [])
    for _ in range(args.rounds):
        for label, (run, err, ms) in times.items():
            ms.append(time_ms(run) if err <= 3 else float("nan"))
    base = sorted(times["cudnn fp16"][2])[args.rounds // 2]
    for label, (run, err, ms) in times.items():
        median = sorted(ms)[len(ms) // 2]
        spread = f"  rounds {' '.join(f'{m:.3f}' for m in ms)}" if len(ms) > 1 else ""
        print(f"{tag:<24} {label:<30} {median:>7.3f} {flops / median / 1e9:>8.1f} {base / median:>8.2f} "
              f"{err:>16.2f}{spread}")
    sys.stdout.flush()
