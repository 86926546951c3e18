"""Probe: FA3 backward variants against each other and SDPA cuDNN, alternating rounds (issue 57).

At the issue's shapes (float16, B x N = 32k tokens, H x D = 2048, N 4k and 16k, d64 and d128,
causal and not): first each variant's dq, dk, dv against the float64 oracle at one ragged,
grouped shape (``flashlib.testing``'s tolerance), then ``--rounds`` rounds, each timing every
variant's backward and cuDNN's (fwd+bwd minus fwd, autograd) with ``triton.testing.do_bench``
in turn, so that clock drift falls on all alike. Prints medians over rounds, TFLOP/s (2.5x the
forward's 4 B H N N D, halved for causal) and ratios to cuDNN.

    PYTHONPATH=$PWD FLASHLIB_AUTOTUNE=0 python benchmarks/probes/fa3_bwd_split_ab.py [--variants 2wg,2wg_split] [--rounds 3]
"""
import argparse
import statistics

import torch
import triton.testing

from flashlib.bench.harness import sdpa as sdpa_backend
from flashlib.kernels import fa3_bwd
from flashlib.kernels.fa3_fwd import fa3_forward
from flashlib import testing
from flashlib.reference import attention_naive, attention_ref


def check(variant, D, causal):
    """dq, dk, dv of ``variant`` against float64 autograd through the oracle (ragged, GQA 3:1)."""
    B, Hq, Hkv, Nq, Nk = 2, 6, 2, 1000, 1531
    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.float16) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse = fa3_forward(q, k, v, causal=causal)
    grads = fa3_bwd.fa3_backward(q, k, v, out, lse, dout, causal=causal, variant=variant)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attention_ref(*leaves, causal=causal)[0], leaves, dout.double())
    naive = [t.clone().requires_grad_() for t in (q, k, v)]
    base = torch.autograd.grad(attention_naive(*naive, causal=causal), naive, dout)
    mags = testing.attention_magnitudes(q, k, v, dout, causal=causal)
    for name, got, want, b in zip(("dq", "dk", "dv"), grads, ref, base):
        assert torch.isfinite(got).all(), f"{variant} {name} has NaN or inf entries"
        testing.assert_close(got, want, baseline=b, name=f"{variant} d{D} causal={causal} {name}",
                             magnitude=mags[name])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="2wg,2wg_split")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    variants = args.variants.split(",")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for D in (64, 128):
        for causal in (False, True):
            for variant in variants:
                check(variant, D, causal)
    print(f"oracle checks passed: {variants} at d64/d128, causal and not (2 x 6/2 heads x 1000 x 1531)")
    cudnn = sdpa_backend("sdpa_cudnn")
    print(f"{'shape':24} " + " ".join(f"{v:>16}" for v in variants) + f" {'sdpa cudnn':>16}  (bwd TFLOP/s, ratio to cuDNN)")
    for D in (64, 128):
        for N in (4096, 16384):
            for causal in (False, True):
                B, H = 32768 // N, 2048 // D
                q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(4))
                out, lse = fa3_forward(q, k, v, causal=causal)
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                runs = {variant: (lambda variant=variant: fa3_bwd.fa3_backward(
                    q, k, v, out, lse, dout, causal=causal, variant=variant)) for variant in variants}
                runs["fwd_bwd cudnn"] = lambda: torch.autograd.grad(cudnn(*leaves, causal), leaves, dout)

                def fwd():
                    with torch.no_grad():
                        return cudnn(*leaves, causal)
                runs["fwd cudnn"] = fwd
                times = {name: [] for name in runs}
                for fn in runs.values():
                    fn()
                for _ in range(args.rounds):
                    for name, fn in runs.items():
                        times[name].append(triton.testing.do_bench(fn))
                ms = {name: statistics.median(t) for name, t in times.items()}
                ms["sdpa cudnn"] = ms["fwd_bwd cudnn"] - ms["fwd cudnn"]
                flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
                cells = []
                for name in variants + ["sdpa cudnn"]:
                    spread = (f" ±{(max(times[name]) - min(times[name])) / ms[name] / 2:.1%}"
                              if name in times else "")
                    cells.append(f"{flops / ms[name] * 1e-9:6.0f} {ms['sdpa cudnn'] / ms[name]:.3f}x{spread}")
                print(f"d{D} N{N} B{B} H{H} {'causal' if causal else 'full':6} " + " ".join(f"{c:>16}" for c in cells),
                      flush=True)


if __name__ == "__main__":
    main()
