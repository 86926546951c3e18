"""Probe: where a short forward+backward's time goes, and which kernels should take it.

1. Host microseconds per call of each layer at a tiny shape (B=1, H=2, N=128, d=64, bfloat16,
   causal), where the kernels are far shorter than the calls: 100 calls back to back that never
   wait for the GPU (fewer than its launch queue holds), best of 7. FA2's and FA3's launchers,
   replaying their plans (kernels/launch.py), and the whole flash_attention forward and
   forward+backward against SDPA's default dispatch.
2. At the short suite's shapes (causal, bfloat16, B x N = 16k tokens; H=12 d=64 and H=16 d=128):
   do_bench of the eager forward+backward, and the GPU's own kernel time (torch.profiler), for
   flashlib with FA2's kernels, flashlib with FA3's (the fa3_from_flops option at 0) and SDPA's default.
3. cProfile's top functions of flashlib's forward+backward with FA3 at the tiny shape.
4. ``floor`` alone: the same forward+backward through two Python autograd nodes that do less than
   flashlib's: ``LeanAttention`` (FA2's launchers and nothing else: no checks, options or
   dispatch) and host_overhead_probe.py's ``EmptyAttention`` (the allocations only, no launch),
   beside flashlib and SDPA's default: host us at the tiny shape, and do_bench ms at GPT-2's
   B8 H12 d64 N=256 and 1024.

    PYTHONPATH=$PWD FLASHLIB_AUTOTUNE=0 python benchmarks/probes/launch_breakdown_probe.py [floor]
"""
import cProfile
import io
import pstats
import sys

import torch
import torch.nn.functional as F
import triton

import flashlib
from flashlib import ops
from flashlib.bench.decode import host_time
from flashlib.inputs import check_inputs
from flashlib.kernels import fa2_bwd, fa2_fwd, fa3_bwd, fa3_fwd, launch
from host_overhead_probe import EmptyAttention   # the node that only allocates (this folder's probe)


def inputs(B, H, N, D):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    return q, k, v, torch.randn_like(q)


def steps(q, k, v, dout):
    def flashlib_step():
        return torch.autograd.grad(flashlib.flash_attention(q, k, v, causal=True), (q, k, v), dout)

    def sdpa_step():
        return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                   (q, k, v), dout)
    return flashlib_step, sdpa_step


def with_fa3(on, fn):
    def call():
        with flashlib.kernel_options(**(dict(fa3=True, fa3_from_flops=0) if on else dict(fa3=False))):
            return fn()
    return call


def kernel_times(fn, calls=20, warmup=1):
    """{CUDA kernel: microseconds per call of fn} under torch.profiler, ``calls`` calls after
    ``warmup`` untimed ones (also benchmarks/probes/production_probe.py's layout_profile)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.self_device_time_total / calls for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.count}


def kernel_us(fn):
    """Microseconds of CUDA kernels per call of fn (``kernel_times`` summed)."""
    return sum(kernel_times(fn).values())


def host_breakdown():
    q, k, v, dout = inputs(1, 2, 128, 64)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    out, lse = fa2_fwd.fa2_forward(qd, kd, vd, causal=True)
    fa2_bwd.fa2_backward(qd, kd, vd, out, lse, dout, causal=True)
    fa3_fwd.fa3_forward(qd, kd, vd, causal=True)
    fa3_bwd.fa3_backward(qd, kd, vd, out, lse, dout, causal=True)
    fl, sdpa = steps(q, k, v, dout)
    print("## host time per call, B=1 H=2 N=128 d=64 bfloat16 causal (us)")
    rows = [("torch.empty_like(q)", lambda: torch.empty_like(qd), False),
            ("launch.plan_key(q, k, v)", lambda: launch.plan_key((qd, kd, vd), (True,)), False),
            ("check_inputs", lambda: check_inputs(q, k, v, causal=True), False),
            ("fa2_forward, replay (1 launch)", lambda: fa2_fwd.fa2_forward(qd, kd, vd, causal=True), False),
            ("fa2_backward, replay (2 launches)",
             lambda: fa2_bwd.fa2_backward(qd, kd, vd, out, lse, dout, causal=True), False),
            ("fa3_forward, replay (1 launch)", lambda: fa3_fwd.fa3_forward(qd, kd, vd, causal=True), False),
            ("fa3_backward, replay (3 launches, 1 memset)",
             lambda: fa3_bwd.fa3_backward(qd, kd, vd, out, lse, dout, causal=True), False),
            ("flash_attention forward, FA2", with_fa3(False, lambda: flashlib.flash_attention(q, k, v, causal=True)), True),
            ("flash_attention forward, FA3", with_fa3(True, lambda: flashlib.flash_attention(q, k, v, causal=True)), True),
            ("SDPA default forward", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), True),
            ("flashlib fwd+bwd, FA2", with_fa3(False, fl), True),
            ("flashlib fwd+bwd, FA3", with_fa3(True, fl), True),
            ("SDPA default fwd+bwd", sdpa, True)]
    for name, fn, grad in rows:
        fn()
        print(f"  {name:44} {host_time(fn, calls=100, repeats=7, grad=grad):7.1f}")
    print_profile(with_fa3(True, fl), 300, "flashlib fwd+bwd with FA3", top=18)


def print_profile(step, calls, what, top):
    """cProfile's ``top`` functions by own time over ``calls`` calls of ``step``."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    print(f"  cProfile of {calls} {what}, by own time:")
    print("\n".join("    " + line for line in text.getvalue().splitlines()[6:top + 10]))


def short_shapes():
    print("\n## eager fwd+bwd, causal bfloat16, B x N = 16k tokens: do_bench us (kernels us)")
    print(f"  {'shape':22} {'FA2':>16} {'FA3':>16} {'SDPA default':>16}   FA2/SDPA FA3/SDPA")
    for D, H in ((64, 12), (128, 16)):
        for N in (128, 256, 512, 1024, 2048, 4096):
            q, k, v, dout = inputs(16384 // N, H, N, D)
            fl, sdpa = steps(q, k, v, dout)
            cells = []
            for fn in (with_fa3(False, fl), with_fa3(True, fl), sdpa):
                fn()
                cells.append((triton.testing.do_bench(fn, warmup=25, rep=200) * 1e3, kernel_us(fn)))
            text = "".join(f" {ms:8.1f} ({k:5.1f})" for ms, k in cells)
            print(f"  B{16384 // N} H{H} N{N} d{D}".ljust(24) + text +
                  f"   {cells[2][0] / cells[0][0]:7.2f}x {cells[2][0] / cells[1][0]:7.2f}x")


class LeanAttention(torch.autograd.Function):
    """A Python autograd node with FA2's launchers (their plans replayed) and nothing else."""
    @staticmethod
    def forward(ctx, q, k, v):
        out, lse = fa2_fwd.fa2_forward(q, k, v, causal=True)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return fa2_bwd.fa2_backward(*ctx.saved_tensors, dout, causal=True)


def floors():
    def node_step(node, q, k, v, dout):
        return lambda: torch.autograd.grad(node.apply(q, k, v)[0], (q, k, v), dout)

    def rows(q, k, v, dout):
        fl, sdpa = steps(q, k, v, dout)
        return {"SDPA default": sdpa, "flashlib": fl,   # FA2 below fa3_from_flops at every shape here
                "LeanAttention (FA2 launchers only)": node_step(LeanAttention, q, k, v, dout),
                "EmptyAttention (allocations only)": node_step(EmptyAttention, q, k, v, dout)}
    q, k, v, dout = inputs(1, 2, 128, 64)
    LeanAttention.apply(q, k, v)[0].backward(dout)   # the same kernels as flashlib's at this shape
    torch.testing.assert_close(torch.autograd.grad(LeanAttention.apply(q, k, v)[0], q, dout)[0],
                               torch.autograd.grad(flashlib.flash_attention(q, k, v, causal=True), q, dout)[0])
    print("## fwd+bwd host us per call, B=1 H=2 N=128 d=64 bfloat16 causal, 3 alternating rounds")
    table = rows(q, k, v, dout)
    times = {name: [] for name in table}
    for _ in range(3):
        for name, fn in table.items():
            fn()
            times[name].append(host_time(fn, calls=100, repeats=7, grad=True))
    for name, ts in times.items():
        print(f"  {name:40} " + " ".join(f"{t:7.1f}" for t in ts))
    print("## fwd+bwd do_bench ms, B8 H12 d64 bfloat16 causal, 3 alternating rounds")
    for N in (256, 1024):
        table = rows(*inputs(8, 12, N, 64))
        times = {name: [] for name in table}
        for _ in range(3):
            for name, fn in table.items():
                fn()
                times[name].append(triton.testing.do_bench(fn, warmup=25, rep=200))
        for name, ts in times.items():
            print(f"  N{N:<5} {name:40} " + " ".join(f"{t:7.3f}" for t in ts)
                  + f"   {min(times['SDPA default']) / min(ts):5.2f}x SDPA")
    for name in ("LeanAttention (FA2 launchers only)", "flashlib"):
        print_profile(rows(q, k, v, dout)[name], 1000, f"{name} fwd+bwd at the tiny shape", top=16)


if __name__ == "__main__":
    print(f"flashlib {flashlib.__file__}; {torch.cuda.get_device_name()}; torch {torch.__version__} "
          f"triton {triton.__version__}; fast launch {launch.enabled(flashlib.runtime.OPTIONS)}; "
          f"fa3_from_flops {flashlib.runtime.OPTIONS.fa3_from_flops}")
    if sys.argv[1:] == ["floor"]:
        floors()
    else:
        host_breakdown()
        short_shapes()
