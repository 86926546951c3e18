"""FA3's forward with part of its exp2s on the FMA units (``tile.exp2_fma``), on a GPU.

FlashAttention-4's software exp2: the special-function unit (SFU) that runs ``ex2.approx`` does
16 lanes a cycle per SM, the FMA units 128. At d64, in FP8, and with a softcap (tanh is a second
SFU op per score), the SFU's time per block is about the tensor cores' time: a polynomial for 1 or
2 of every 4 exp2s (about 10 FMA-unit instructions each, ``tile.EXP2_POLY``) moves work off it.

For each case, the default variant with ``exp2_fma`` = 0, 1, 2: out and lse checked against the
float64 oracle on (batch 0, 2 heads) with the library's tolerance rule (``testing``: the lse
within float32 rounding), then timed (``do_bench`` median) in two rounds, 0 1 2 then 2 1 0, so
that a drift in the machine shows as a difference between rounds. SDPA's cuDNN forward in the
same process for the 16-bit cases. FP8: the error against exp2_fma=0's output only.

    FLASHLIB_AUTOTUNE=0 python benchmarks/exp2_fma_probe.py
"""
import torch
import torch.nn.functional as F
import triton

from flashlib.bench.harness import _time, make_inputs, shape_for
from flashlib.bench.production import SOFTCAP
from flashlib.kernels.versions import attention_flops
from flashlib.kernels import fa3_fwd, score_mod
from flashlib.testing import assert_attention_close

CASES = [  # (dtype, D, N, causal, softcap)
    (torch.float16, 128, 4096, False, None),
    (torch.float16, 64, 4096, False, None),
    (torch.float16, 64, 4096, True, None),
    (torch.bfloat16, 128, 4096, True, SOFTCAP),
    (torch.bfloat16, 128, 16384, False, SOFTCAP),
    (torch.float8_e4m3fn, 128, 4096, False, None),
    (torch.float8_e4m3fn, 64, 4096, False, None),
]


def cudnn(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for dtype, D, N, causal, softcap in CASES:
        s = shape_for(D, N)
        B, H = s["B"], s["Hq"]
        flops = attention_flops(B, H, N, N, D, causal=causal)
        fp8 = dtype == torch.float8_e4m3fn
        q, k, v = make_inputs(B, H, H, N, N, D, torch.bfloat16 if fp8 else dtype, "cuda")
        tag = f"{str(dtype)[6:]} d{D} N{N} causal={causal} softcap={softcap}"
        if fp8:
            descale = torch.ones(3, B, H, device="cuda")
            q8, k8, v8 = (t.to(dtype) for t in (q, k, v))
            calls = {n: (lambda n=n: fa3_fwd.fa3_forward_fp8(q8, k8, v8, descale, causal=causal, exp2_fma=n))
                     for n in range(3)}
        else:
            mod = score_mod.make(q, softcap=softcap) if softcap else None
            calls = {n: (lambda n=n: fa3_fwd.fa3_forward(q, k, v, causal=causal, score_mod=mod, exp2_fma=n))
                     for n in range(3)}
        good, base = {}, calls[0]()
        for n, call in calls.items():
            out, lse = call()
            try:
                if fp8:
                    err = (out.float() - base[0].float()).abs().max().item()
                    lerr = (lse - base[1]).abs().max().item()
                    print(f"{tag} exp2_fma={n}: |out - out0| {err:.3g}, |lse - lse0| {lerr:.3g}")
                else:
                    err = assert_attention_close(out[:1, :2], lse[:1, :2], q[:1, :2], k[:1, :2], v[:1, :2],
                                                 causal=causal, softcap=softcap)
                    print(f"{tag} exp2_fma={n}: oracle ok, out error {err:.3g}, "
                          f"|lse - lse0| {(lse - base[1]).abs().max().item():.3g}")
                good[n] = call
            except AssertionError as e:
                print(f"{tag} exp2_fma={n}: WRONG {e}")
        times = {n: [] for n in good}
        for order in (sorted(good), sorted(good, reverse=True)):
            for n in order:
                times[n].append(_time(good[n]))
        ref = None if fp8 or softcap else _time(lambda: cudnn(q, k, v, causal))
        for n, ms in times.items():
            best = min(ms)
            cells = f"{' / '.join(f'{t:.3f}' for t in ms)} ms, {flops / best / 1e9:.0f} TFLOP/s, " \
                    f"{min(times[0]) / best:.3f}x exp2_fma=0"
            if ref:
                cells += f", {ref / best:.3f}x cuDNN ({ref:.3f} ms)"
            print(f"{tag} exp2_fma={n}: {cells}", flush=True)


if __name__ == "__main__":
    main()
