"""Which forward kernel at each head dim: FA2's against FA3's on Hopper, in one process.

At the forward suite's shapes (``flashlib.bench.harness``: B x N = 32k tokens, H x D = 2048),
float16, both kernels called directly (``fa2_fwd.fa2_forward``, with its first fitting config
under FLASHLIB_AUTOTUNE=0 and autotuned otherwise; ``fa3_fwd.fa3_forward``) and SDPA's cuDNN
backend as the yardstick, in rounds that alternate the order. ``fa3_unfolded``: FA3 with the
softmax scale applied before the max (the ``fa3_fold_scale`` kernel option off).
Every kernel is first checked against the float64 oracle on a slice of its own output
(``production.oracle_check``).

    [FLASHLIB_AUTOTUNE=0] python benchmarks/probes/fa2_fa3_forward_probe.py [--fp8 | --softcap] [--head-dim=D] [--rounds=3]

``--fp8``: instead of FA2 and FA3, ``flash_attention`` on e4m3 copies of the inputs, folded and not
(their outputs compared with each other: e4m3's error is the FP8 suite's to report).
``--softcap``: bfloat16 at the production suite's modifier shapes, every kernel with Gemma 2's
softcap (``production.SOFTCAP``), and ``fa3_plain``, FA3 without it, for the softcap's ratio.
"""
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlib
from flashlib.bench import production as prod
from flashlib.bench.harness import time_ms, make_inputs, shape_for
from flashlib.kernels import fa2_fwd, fa3_fwd, score_mod

SHAPES = [(64, 4096, False), (64, 16384, False), (64, 4096, True), (128, 4096, False),
          (128, 16384, False), (128, 16384, True)]
ROUNDS = next((int(a.split('=')[1]) for a in sys.argv[1:] if a.startswith('--rounds=')), 3)


def cudnn(q, k, v, causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def unfolded(call):
    """call() with the ``fa3_fold_scale`` option off (the options are in the launch plans' key: no
    stale plan is replayed)."""
    with flashlib.kernel_options(fa3_fold_scale=False):
        return call()


def fp8_calls(q, k, v, causal):
    """``--fp8``: flash_attention on e4m3 copies (per-head scales), folded and not."""
    import flashlib
    from flashlib import fp8
    H = q.shape[1]
    (q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(t, H) for t in (q, k, v))
    call = lambda: flashlib.flash_attention(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,  # noqa: E731
                                            v_descale=vd)
    return {"fp8": call, "fp8_unfolded": lambda: unfolded(call)}


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    softcap = prod.SOFTCAP if "--softcap" in sys.argv else None
    dtype = torch.bfloat16 if softcap else torch.float16
    print(f"# {dtype} forward{' with a softcap' if softcap else ''}, ms (median of rounds) (TFLOP/s, cuDNN's "
          "time over it, the rounds' range); fa3 / fa2: FA3's time over FA2's (> 1: FA2 faster)")
    dims = [int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--head-dim=")]
    for D, N, causal in prod.MOD_SHAPES if softcap else SHAPES:
        if dims and D not in dims:
            continue
        B, H = shape_for(D, N)["B"], prod.WIDTH // D
        q, k, v = make_inputs(B, H, H, N, N, D, dtype, "cuda")
        mod = score_mod.make(q, score_mod.Modifiers(softcap=softcap)) if softcap else None
        calls = {"fa2": lambda: fa2_fwd.fa2_forward(q, k, v, causal=causal, score_mod=mod)[0],
                 "fa3": lambda: fa3_fwd.fa3_forward(q, k, v, causal=causal, score_mod=mod)[0],
                 "fa3_unfolded": lambda: unfolded(lambda: fa3_fwd.fa3_forward(q, k, v, causal=causal,
                                                                              score_mod=mod)[0])}
        if softcap:   # the plain kernel users get, for the modifier's ratio to it
            calls["fa3_plain"] = lambda: fa3_fwd.fa3_forward(q, k, v, causal=causal)[0]
        if "--fp8" in sys.argv:
            calls = fp8_calls(q, k, v, causal)
        calls["cudnn"] = lambda: cudnn(q, k, v, causal)
        times = {name: [] for name in calls}
        for name, call in calls.items():
            if name.startswith("fp8"):   # e4m3's own error: against the other FP8 arm, not the oracle
                first = calls["fp8"]()
                err = (call().float() - first.float()).abs().max().item()
                print(f"d{D} N{N} causal={causal} {name}: |out - fp8's out| {err:.3g}")
                continue
            options = dict(softcap=softcap) if softcap and name not in ("fa3_plain", "cudnn") else {}
            err, ok = prod.oracle_check([tuple(t[:1, :2] for t in (call(), q, k, v))], dtype,
                                        causal=causal, **options)
            if not ok:
                print(f"d{D} N{N} causal={causal} {name}: WRONG (error {err:.3g})")
                times.pop(name)
        for r in range(ROUNDS):
            for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
                times[name].append(time_ms(calls[name]))
        flops = prod.attention_flops(B, H, N, N, D, causal=causal)
        ms = {name: statistics.median(t) for name, t in times.items()}
        cells = " | ".join(f"{name} {t:.3f} ({flops / t / 1e9:.0f}, {ms['cudnn'] / t:.3f}x cuDNN, "
                           f"rounds {min(times[name]):.3f}-{max(times[name]):.3f})" for name, t in ms.items())
        ratio = ms["fa3"] / ms["fa2"] if "fa2" in ms and "fa3" in ms else float("nan")
        print(f"d{D} N{N} causal={causal} | {cells} | fa3 / fa2 {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
