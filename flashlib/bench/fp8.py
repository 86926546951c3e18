"""The FP8 forward suite: FlashAttention-3's e4m3 forward (section 3.3) against 16-bit attention.

For each shape of the forward suite (fp16 inputs, B x N = 32k tokens, H x D = 2048), q, k and v
are quantised with ``flashlib.fp8.quantize`` (per-(batch, kv-head) scales), then:

- error first, on the first batch element and two heads: the FP8 output (bfloat16) and
  flashlib's fp16 output against the float64 oracle on the *original* fp16 inputs (what a user
  compares with), max abs error and RMS error, both recorded;
- times (``do_bench`` medians) of ``flash_attention`` on the FP8 inputs (its V-transpose copy
  included, quantisation not: a model keeps its K/V cache in FP8), of SDPA cuDNN and of flashlib
  on the fp16 inputs.

Records in the harness's format, the FP8 ones with ``dtype: "float8_e4m3fn"``, and
``ratio_vs_sdpa_cudnn``: cuDNN's fp16 time over this record's (the issue's bar: >= 1.3x).
``python -m flashlib.bench --suite fp8``.
"""
import torch

from .. import fp8, runtime
from ..ops import flash_attention
from ..reference import attention_ref
from ..kernels.dispatch import attention_flops
from .harness import FORWARD_SHAPES, sdpa, time_ms, make_inputs, shape_for


def errors(out, ref):
    """(max abs error, RMS error) of out against the float64 ref."""
    d = out.double() - ref
    return d.abs().max().item(), d.pow(2).mean().sqrt().item()


def run_suite(quick=False, progress=None):
    shapes = FORWARD_SHAPES[:1] + FORWARD_SHAPES[3:4] if quick else FORWARD_SHAPES
    records = []
    for D, N, causal in (progress(shapes, desc="fp8") if progress else shapes):
        s = shape_for(D, N)
        B, H = s["B"], s["Hq"]
        q, k, v = make_inputs(B, H, H, N, N, D, torch.float16, runtime.DEVICE)
        (q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(t, H) for t in (q, k, v))
        run_fp8 = lambda: flash_attention(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                          v_descale=vd)
        ref, _ = attention_ref(q[:1, :2], k[:1, :2], v[:1, :2], causal=causal)
        err8 = errors(run_fp8()[:1, :2], ref)
        err16 = errors(flash_attention(q[:1, :2], k[:1, :2], v[:1, :2], causal=causal), ref)
        cudnn = sdpa("sdpa_cudnn")
        flops = attention_flops(B, H, N, N, D, causal=causal)
        base = dict(op="fwd", B=B, Hq=H, Hkv=H, Nq=N, Nk=N, D=D, causal=causal, density=1.0,
                    gbps=None, peak_mem_gb=None, ratio_vs_sdpa_flash=None)
        shape_records = []
        for impl, dtype, fn, err in (
                ("flashlib", "float8_e4m3fn", run_fp8, err8),
                ("flashlib", "float16", lambda: flash_attention(q, k, v, causal=causal), err16),
                ("sdpa_cudnn", "float16", lambda: cudnn(q, k, v, causal), None)):
            with torch.no_grad():
                ms = time_ms(fn)
            rec = dict(base, impl=impl, dtype=dtype, ms=ms, tflops=flops / ms / 1e9)
            if err:
                rec.update(max_err=err[0], rms_err=err[1])
            shape_records.append(rec)
        for rec in shape_records:    # cuDNN's fp16 time over each record's, whatever its dtype
            rec["ratio_vs_sdpa_cudnn"] = round(shape_records[-1]["ms"] / rec["ms"], 3)
        records += shape_records
    return records


def print_table(records):
    print(f"{'impl':<10} {'dtype':<14} {'shape':<26} {'ms':>8} {'TFLOP/s':>8} {'vs cuDNN':>8} "
          f"{'max err':>9} {'rms err':>9}")
    for r in records:
        shape = f"B{r['B']} H{r['Hq']} N{r['Nq']} d{r['D']}{' c' if r['causal'] else ''}"
        err = (f"{r['max_err']:>9.2e} {r['rms_err']:>9.2e}" if "max_err" in r else "")
        print(f"{r['impl']:<10} {r['dtype']:<14} {shape:<26} {r['ms']:>8.3f} {r['tflops']:>8.1f} "
              f"{r.get('ratio_vs_sdpa_cudnn') or 0:>8.2f} {err}")
