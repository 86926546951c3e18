"""Probe: where flashlib's host time per flash_attention call goes, against SDPA's flash backend,
at lesson 11's shape (B=32, 6 query heads over 2 K/V heads, T=256, d=64, bfloat16, causal), where
the kernels take 0.07 ms per forward+backward (short_sequence_probe.log) and host time decides.

Host microseconds per call: the best of 7 loops of 1000 calls that never wait for the GPU (the
kernels are shorter than the calls, so the loop measures the host). Then the forward+backward with
autograd's backward on its worker thread (PyTorch's default on CUDA) and on the calling thread;
then, per .backward() call, the time until flashlib's backward starts, in it, and after it.

    PYTHONPATH=$PWD python benchmarks/probes/host_time_probe.py   (on a GPU; h200/host_time_probe.log)
"""
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlib
from flashlib.bench.decode import host_time
from flashlib.kernels.fa2_bwd import fa2_backward
from flashlib.kernels.fa2_fwd import fa2_forward
from flashlib.inputs import check_inputs
from flashlib.ops import FlashAttention


def host_us(fn):
    return host_time(fn, calls=1000, repeats=7, grad=True)


def sdpa(q, k, v):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def fl(q, k, v):
    return flashlib.flash_attention(q, k, v, causal=True)


q = torch.randn(32, 6, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(32, 2, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(2))
dout = torch.randn_like(q)
qd, kd, vd = q.detach(), k.detach(), v.detach()
out, lse = fa2_forward(qd, kd, vd, causal=True)
print(f"flashlib {flashlib.__file__}, autotune {flashlib.runtime.OPTIONS.autotune}")
for name, fn in [("check_inputs", lambda: check_inputs(q, k, v, causal=True)),
                 ("fa2_forward (launcher)", lambda: fa2_forward(qd, kd, vd, causal=True)),
                 ("fa2_backward (launcher)", lambda: fa2_backward(qd, kd, vd, out, lse, dout, causal=True)),
                 ("flash_attention forward", lambda: fl(q, k, v)),
                 ("SDPA flash forward", lambda: sdpa(q, k, v))]:
    print(f"  {name:26} {host_us(fn):7.1f} us")
for threads in (True, False):
    torch.autograd.set_multithreading_enabled(threads)
    f, s = (host_us(lambda: attend(q, k, v).backward(dout)) for attend in (fl, sdpa))
    print(f"  fwd+bwd, backward on {'worker' if threads else 'caller'} thread: "
          f"flashlib {f:6.1f} us, SDPA {s:6.1f} us")

inside = []
flash_backward = FlashAttention.backward
def timed_backward(ctx, *grads):
    start = time.perf_counter()
    grads = flash_backward(ctx, *grads)
    inside.append((start, time.perf_counter()))
    return grads
FlashAttention.backward = staticmethod(timed_backward)
for threads in (True, False):
    torch.autograd.set_multithreading_enabled(threads)
    parts = []
    for _ in range(300):
        o = fl(q, k, v)
        inside.clear()
        start = time.perf_counter()
        o.backward(dout)
        end = time.perf_counter()
        parts.append((inside[0][0] - start, inside[0][1] - inside[0][0], end - inside[0][1]))
    before, within, after = (sorted(p)[len(p) // 2] * 1e6 for p in zip(*parts))
    print(f"  .backward() on {'worker' if threads else 'caller'} thread, medians: {before:5.1f} us "
          f"to flashlib's backward, {within:5.1f} in it, {after:5.1f} after")
