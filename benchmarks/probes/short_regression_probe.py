"""Where the short suite's d64 rows lost time between two trees: the GPU's kernel time per eager
forward+backward (torch.profiler, by kernel) and do_bench's wall time, at the short suite's d64
shapes (causal, bfloat16, B x N = 16k tokens, H = 12), autotuned as the suite runs. Run it once
per tree (PYTHONPATH picks the tree):

    PYTHONPATH=build/ab_base python benchmarks/probes/short_regression_probe.py
    PYTHONPATH=$PWD python benchmarks/probes/short_regression_probe.py
"""
import torch
import triton

import flashlib
from launch_breakdown_probe import inputs, kernel_times, steps

print(f"flashlib {flashlib.__file__}; {torch.cuda.get_device_name()}")
for N in (128, 256, 512, 1024):
    q, k, v, dout = inputs(16384 // N, 12, N, 64)
    fl, sdpa = steps(q, k, v, dout)
    for name, fn in (("flashlib", fl), ("sdpa_default", sdpa)):
        fn()
        ms = triton.testing.do_bench(fn, warmup=25, rep=200)
        kernels = kernel_times(fn)
        top = ", ".join(f"{key[:48]} {us:.1f}" for key, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:4])
        print(f"  B{16384 // N} H12 N{N} d64 {name:13} do_bench {ms * 1e3:7.1f} us, kernels {sum(kernels.values()):7.1f} us: {top}",
              flush=True)
