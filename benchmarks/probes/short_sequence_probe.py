"""Probe: flashlib's flash_attention against SDPA's flash backend at short sequences (lesson 11's
model: T=256, 6 query heads over 2 K/V heads, d=64) and longer ones, bfloat16, causal; median ms of
do_bench for the forward and for forward + backward (host time included: these calls are short),
then the GPU time alone: the CUDA kernels' own time per call, from torch.profiler over 20 calls.

    PYTHONPATH=$PWD python benchmarks/probes/short_sequence_probe.py   (on a GPU; h200/short_sequence_probe.log)
"""
import torch, triton.testing, torch.nn.functional as F
import flashlib
from torch.nn.attention import SDPBackend, sdpa_kernel
def sdpa(q, k, v):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
fl = lambda q, k, v: flashlib.flash_attention(q, k, v, causal=True)
print(f"{'shape':40} {'fl fwd':>8} {'sdpa fwd':>8} {'fl f+b':>8} {'sdpa f+b':>8}")
for B, H, Hkv, T, D in [(32, 6, 2, 256, 64), (32, 6, 6, 256, 64), (64, 6, 2, 256, 64), (8, 16, 16, 1024, 64), (4, 16, 16, 4096, 64)]:
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    r = []
    for fn in (fl, sdpa):
        r.append(triton.testing.do_bench(lambda: fn(q, k, v), return_mode="median"))
    for fn in (fl, sdpa):
        r.append(triton.testing.do_bench(lambda: fn(q, k, v).backward(do), return_mode="median"))
    print(f"{str((B, H, Hkv, T, D)):40} " + " ".join(f"{x:8.3f}" for x in r), flush=True)


def kernel_ms(fn, calls=20):
    """GPU time per call: the sum of the CUDA kernels' own times under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / calls / 1e3


print(f"\nGPU kernel time only, ms per call\n{'shape':40} {'fl fwd':>8} {'sdpa fwd':>8} {'fl f+b':>8} {'sdpa f+b':>8}")
for B, H, Hkv, T, D in [(32, 6, 2, 256, 64), (32, 6, 6, 256, 64), (8, 16, 16, 1024, 64), (4, 16, 16, 4096, 64)]:
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    r = [kernel_ms(lambda: fn(q, k, v)) for fn in (fl, sdpa)]
    r += [kernel_ms(lambda: fn(q, k, v).backward(do)) for fn in (fl, sdpa)]
    print(f"{str((B, H, Hkv, T, D)):40} " + " ".join(f"{x:8.3f}" for x in r), flush=True)
