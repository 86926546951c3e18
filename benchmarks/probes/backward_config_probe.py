"""The FA2 backward's fixed configs at d128 (what runs untuned: FLASHLIB_AUTOTUNE=0, or problems
under 2^24 scores), one H100: each dK/dV config with the dQ kernel's first, then each dQ config
with the best dK/dV one. The first configs spill at d128 (ptxas for sm90: dK/dV 1568 bytes), and
FlexAttention's backward beat them there in the production suite (ALiBi, forward+backward).

Every config's gradients are compared with the first config's (max difference printed) after the
first config's are checked against the float64 oracle on two heads.

    FLASHLIB_AUTOTUNE=0 python benchmarks/probes/backward_config_probe.py [--d64 | --chosen]

The gradients of every config came out bit for bit equal to the first's on an H100: the dK/dV
and dQ accumulators take their k-chunks in the same order whatever the tile.
"""
import os

os.environ.setdefault("FLASHLIB_AUTOTUNE", "0")

import torch  # noqa: E402
import triton  # noqa: E402

from flashlib.kernels import fa2_bwd, fa2_fwd  # noqa: E402
from flashlib.testing import assert_attention_close  # noqa: E402

import sys  # noqa: E402

# (B, H, N, D, causal): 32k tokens, H x D = 2048, as the suites; ``--d64`` for the d64 pair
SHAPES = [(2, 16, 16384, 128, False), (8, 16, 4096, 128, True)]
if "--d64" in sys.argv:
    SHAPES = [(2, 32, 16384, 64, False), (8, 32, 4096, 64, True)]
if "--chosen" in sys.argv:   # only the launcher's own untuned choice, at both head dims' shapes
    SHAPES = [(2, 32, 16384, 64, False), (8, 32, 4096, 64, True), *SHAPES]


def fixed(kernel, config):
    bm, bn, warps, stages = config
    return lambda *a, **k: (kernel, dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages))


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    chosen = fa2_bwd._choose_dkdv, fa2_bwd._choose_dq
    for B, H, N, D, causal in SHAPES:
        g = torch.Generator("cuda").manual_seed(0)
        q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        out, lse = fa2_fwd.fa2_forward(q, k, v, causal=causal)
        few = [t[:1, :2] for t in (q, k, v)]
        assert_attention_close(out[:1, :2], lse[:1, :2], *few, causal=causal)
        flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
        reference = None

        def run(dkdv, dq):
            fa2_bwd._choose_dkdv, fa2_bwd._choose_dq = fixed(fa2_bwd._dkdv_kernel, dkdv), fixed(fa2_bwd._dq_kernel, dq)
            fa2_bwd._plans.clear()
            try:
                grads = fa2_bwd.fa2_backward(q, k, v, out, lse, dout, causal=causal)
                ms = triton.testing.do_bench(lambda: fa2_bwd.fa2_backward(q, k, v, out, lse, dout, causal=causal),
                                             warmup=25, rep=200)
            except Exception as e:   # a config that does not compile or fit
                return None, f"{type(e).__name__}"
            diff = 0.0 if reference is None else max((a.float() - b.float()).abs().max().item()
                                                      for a, b in zip(grads, reference))
            return (ms, grads), f"{ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s), max diff vs first {diff:.3g}"

        shape = f"B{B} H{H} N{N} d{D}{' causal' if causal else ''}"
        if "--chosen" in sys.argv:
            fa2_bwd._choose_dkdv, fa2_bwd._choose_dq = chosen
            fa2_bwd._plans.clear()
            ms = triton.testing.do_bench(lambda: fa2_bwd.fa2_backward(q, k, v, out, lse, dout, causal=causal),
                                         warmup=25, rep=200)
            configs = [c(D, 2, B * H * N * N)[1] for c in chosen]
            print(f"{shape} chosen dkdv {configs[0]} dq {configs[1]}: {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s)")
            continue
        best = None
        for dkdv in fa2_bwd.DKDV_CONFIGS:
            result, text = run(dkdv, fa2_bwd.DQ_CONFIGS[0])
            if result is not None and reference is None:
                reference = result[1]
            print(f"{shape} dkdv {dkdv} dq {fa2_bwd.DQ_CONFIGS[0]}: {text}", flush=True)
            if result is not None and (best is None or result[0] < best[0]):
                best = (result[0], dkdv)
        for dq in fa2_bwd.DQ_CONFIGS[1:]:
            _, text = run(best[1], dq)
            print(f"{shape} dkdv {best[1]} dq {dq}: {text}", flush=True)
    fa2_bwd._choose_dkdv, fa2_bwd._choose_dq = chosen


if __name__ == "__main__":
    main()
