"""Probe: FA3 below ``fa3_from_flops`` at a GPT's shapes, against FA2 and SDPA's default.

The dispatcher sends problems under ``runtime.KernelOptions.fa3_from_flops`` FLOPs to FA2. At
GPT-2 small's training shapes (H12 d64 causal, B x T = 8k) every call is under it. This times
forward and forward+backward (``do_bench`` medians, alternating rounds in one process) of
flashlib with the threshold (default), with FA3 forced (threshold 0), with FA3's backward forced
and the forward by the threshold (``fa3_bwd_forced``: the dispatcher's version 3 patched to take
every backward it can run), and SDPA's default, after checking each against the float64 oracle
on one (batch, head).

    python benchmarks/probes/fa3_threshold_probe.py [--rounds 3]
"""
import argparse
import contextlib
import statistics

import torch
import torch.nn.functional as F
import triton

import flashlib
from flashlib.kernels import dispatch, fa3_bwd
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import assert_attention_close, assert_close, attention_magnitudes

SHAPES = [(8, 12, 1024, 64), (32, 12, 256, 64), (8, 12, 256, 64), (2, 32, 2048, 128)]   # B H N D, causal


@contextlib.contextmanager
def fa3_backward_at_any_size():
    """Inside: version 3's backward takes every call FA3 can run, whatever its size."""
    saved = dispatch.VERSIONS[3]

    def runs(q, k, v, out, lse, dout, causal, mod, cu_seqlens, max_seqlen, options):
        return options.fa3 and fa3_bwd.supported(q, k, v, out, lse, dout, cu_seqlens is not None)
    dispatch.VERSIONS[3] = saved._replace(supports_backward=runs)
    try:
        yield
    finally:
        dispatch.VERSIONS[3] = saved


CONTEXTS = {"fa3_bwd_forced": fa3_backward_at_any_size}   # the others: none


def impls():
    return {"flashlib": lambda q, k, v: flashlib.flash_attention(q, k, v, causal=True),
            "fa3_bwd_forced": lambda q, k, v: flashlib.flash_attention(q, k, v, causal=True),
            "fa3_forced": lambda q, k, v: flashlib.flash_attention(q, k, v, causal=True,
                                                                   kernel_options={"fa3_from_flops": 0}),
            "sdpa_default": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}


def check(q, k, v, dout):
    """flashlib's out, lse and gradients on (batch 0, head 0) against the float64 oracle."""
    few = [t[:1, :1].detach().cpu().double().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = attention_ref(*few, causal=True)
    ref_grads = torch.autograd.grad(ref_out, few, dout[:1, :1].cpu().double())
    naive = [t.detach()[:1, :1].clone().requires_grad_() for t in (q, k, v)]
    baseline = torch.autograd.grad(attention_naive(*naive, causal=True), naive, dout[:1, :1])
    magnitude = attention_magnitudes(*few, dout[:1, :1].cpu().double(), causal=True)
    for name, options in (("flashlib", None), ("fa3_forced", {"fa3_from_flops": 0}), ("fa3_bwd_forced", None)):
        with CONTEXTS.get(name, contextlib.nullcontext)():
            out, lse = flashlib.flash_attention(q, k, v, causal=True, return_lse=True, kernel_options=options)
            assert_attention_close(out[:1, :1].detach().cpu(), lse[:1, :1].cpu(),
                                   *[t[:1, :1].detach().cpu() for t in (q, k, v)], causal=True,
                                   reference=(ref_out.detach(), ref_lse.detach()))
            grads = torch.autograd.grad(out, (q, k, v), dout)
        for g, r, b, n in zip(grads, ref_grads, baseline, ("dq", "dk", "dv")):
            assert_close(g[:1, :1].cpu(), r, baseline=b.cpu(), name=f"{name} {n}", magnitude=magnitude[n])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times = {}
    for B, H, N, D in SHAPES:
        g = torch.Generator("cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                   for _ in range(3))
        dout = torch.randn_like(q)
        check(q, k, v, dout)
        for _ in range(args.rounds):
            for name, fn in impls().items():
                with CONTEXTS.get(name, contextlib.nullcontext)():
                    fwd = triton.testing.do_bench(lambda: fn(q, k, v))
                    both = triton.testing.do_bench(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout))
                times.setdefault((B, H, N, D, name), []).append((fwd, both))
    print("shape | impl | fwd ms | fwd+bwd ms | fwd+bwd vs sdpa_default")
    for B, H, N, D in SHAPES:
        base = statistics.median(t[1] for t in times[(B, H, N, D, "sdpa_default")])
        for name in impls():
            rows = times[(B, H, N, D, name)]
            fwd, both = (statistics.median(t[i] for t in rows) for i in (0, 1))
            print(f"B{B} H{H} N{N} d{D} causal | {name} | {fwd:.3f} | {both:.3f} | {base / both:.2f}x")


if __name__ == "__main__":
    main()
