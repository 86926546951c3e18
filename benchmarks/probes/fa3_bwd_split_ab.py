"""Probe: FA3 backward variants against each other and SDPA cuDNN, alternating rounds (issue 57).

At the issue's shapes (float16, B x N = 32k tokens, H x D = 2048, N 4k and 16k, d64 and d128,
causal and not): first each variant's dq, dk, dv against the float64 oracle at one ragged,
grouped shape (``flashlib.testing``'s tolerance), then ``--rounds`` rounds, each timing every
variant's backward and cuDNN's (fwd+bwd minus fwd, autograd) with ``triton.testing.do_bench``
in turn, so that clock drift falls on all alike. Prints medians over rounds, TFLOP/s (2.5x the
forward's 4 B H N N D, halved for causal) and ratios to cuDNN. --mods softcap,alibi: the same
for the score modifiers (softcap 20, ALiBi with per-head slopes; forward and backward with the
modifier; checked first as the plain kernels), at each head dim, against the plain cuDNN backward (cuDNN
takes no softcap): their ratio shows what the modifier costs each variant. --before FILE: also
an earlier ``fa3_bwd.py`` (e.g. ``git show REV:flashlib/kernels/fa3_bwd.py > FILE``), its
variants named ``before:NAME``; ``default`` names each head dim's default variant.

    PYTHONPATH=$PWD FLASHLIB_AUTOTUNE=0 python benchmarks/probes/fa3_bwd_split_ab.py
        [--variants 2wg,2wg_split] [--rounds 3] [--mods softcap,alibi]
        [--before FILE --variants default,before:default]
"""
import argparse
import importlib.util
import statistics

import torch
import triton.testing

from flashlib.bench.harness import sdpa as sdpa_backend
from flashlib.kernels import fa3_bwd, score_mod
from flashlib.kernels.fa3_fwd import fa3_forward
from flashlib import testing
from flashlib.reference import attention_naive, attention_ref


CHECK_SHAPE = (2, 6, 2, 1000, 1531)   # B, Hq, Hkv, Nq, Nk of the oracle checks


def modifiers(name, Hq):
    """The keyword arguments of ``attention_ref`` for the modifier ``name`` ("plain": none)."""
    slopes = torch.linspace(0.05, 1.0, Hq, device="cuda")
    return {"plain": {}, "softcap": dict(softcap=20.0), "alibi": dict(alibi_slopes=slopes)}[name]


MODULES = {"": fa3_bwd}   # "before": the --before file's module


def load_before(path):
    """``path`` (an fa3_bwd.py) as the module ``flashlib.kernels.fa3_bwd_before`` (its relative
    imports resolve in flashlib.kernels)."""
    spec = importlib.util.spec_from_file_location("flashlib.kernels.fa3_bwd_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    MODULES["before"] = module


def runs_at(variant, D):
    """Whether ``variant`` ([before:]NAME) compiles at head dim D."""
    where, _, name = variant.rpartition(":")
    return name == "default" or D in MODULES[where].VARIANTS[name].head_dims


def backward(variant, q, k, v, dout, causal, mods):
    """(fa3_forward's out and lse, a function running ``variant``'s backward) with modifiers ``mods``;
    variant: [before:]NAME, NAME ``default`` the module's default at q's head dim."""
    where, _, name = variant.rpartition(":")
    module = MODULES[where]
    name = None if name == "default" else name
    mod = score_mod.make(q, score_mod.Modifiers(**mods))
    out, lse = fa3_forward(q, k, v, causal=causal, score_mod=mod if mods else None)
    return lambda: module.fa3_backward(q, k, v, out, lse, dout, causal=causal, variant=name,
                                       score_mod=mod if mods else None)


def alternate(runs, rounds):
    """{name: [do_bench ms of each round]}: every function of ``runs`` once (compile, warm up),
    then ``rounds`` rounds timing each in turn, so that clock drift falls on all alike."""
    times = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(triton.testing.do_bench(fn))
    return times


def check(variant, D, causal, mod="plain"):
    """dq, dk, dv of ``variant`` against float64 autograd through the oracle (ragged, GQA 3:1)."""
    B, Hq, Hkv, Nq, Nk = CHECK_SHAPE
    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.float16) for _ in range(2))
    dout = torch.randn_like(q)
    mods = modifiers(mod, Hq)
    grads = backward(variant, q, k, v, dout, causal, mods)()
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attention_ref(*leaves, causal=causal, **mods)[0], leaves, dout.double())
    naive = [t.clone().requires_grad_() for t in (q, k, v)]
    base = torch.autograd.grad(attention_naive(*naive, causal=causal, **mods), naive, dout)
    mags = testing.attention_magnitudes(q, k, v, dout, causal=causal, **mods)
    for name, got, want, b in zip(("dq", "dk", "dv"), grads, ref, base):
        assert torch.isfinite(got).all(), f"{variant} {mod} {name} has NaN or inf entries"
        testing.assert_close(got, want, baseline=b, name=f"{variant} {mod} d{D} causal={causal} {name}",
                             magnitude=mags[name])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="2wg,2wg_split")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mods", default="", help="comma-separated: softcap, alibi (at each head dim)")
    ap.add_argument("--before", help="an earlier fa3_bwd.py, its variants named before:NAME")
    ap.add_argument("--head-dims", default="64,128")
    args = ap.parse_args()
    if args.before:
        load_before(args.before)
    variants = args.variants.split(",")
    mods = ["plain"] + [m for m in args.mods.split(",") if m]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    head_dims = [int(d) for d in args.head_dims.split(",")]
    for D in head_dims:
        for causal in (False, True):
            for variant in [v for v in variants if runs_at(v, D)]:
                for mod in mods:
                    check(variant, D, causal, mod)
    print(f"oracle checks passed: {variants} at {head_dims} where they run, causal and not "
          f"(2 x 6/2 heads x 1000 x 1531), {', '.join(mods)}")
    cudnn = sdpa_backend("sdpa_cudnn")
    print(f"{'shape':32} " + " ".join(f"{v:>16}" for v in variants)
          + f" {'sdpa cudnn':>16}  (bwd TFLOP/s, ratio to cuDNN's plain backward)")
    cases = [(D, N, causal, mod) for D in head_dims for N in (4096, 16384) for causal in (False, True)
             for mod in mods]
    for D, N, causal, mod in cases:
        B, H = 32768 // N, 2048 // D
        q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(4))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        here = [variant for variant in variants if runs_at(variant, D)]
        runs = {variant: backward(variant, q, k, v, dout, causal, modifiers(mod, H)) for variant in here}
        runs["fwd_bwd cudnn"] = lambda: torch.autograd.grad(cudnn(*leaves, causal), leaves, dout)

        def fwd():
            with torch.no_grad():
                return cudnn(*leaves, causal)
        runs["fwd cudnn"] = fwd
        times = alternate(runs, args.rounds)
        ms = {name: statistics.median(t) for name, t in times.items()}
        ms["sdpa cudnn"] = ms["fwd_bwd cudnn"] - ms["fwd cudnn"]
        flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
        cells = []
        for name in here + ["sdpa cudnn"]:
            spread = (f" ±{(max(times[name]) - min(times[name])) / ms[name] / 2:.1%}"
                      if name in times else "")
            cells.append(f"{flops / ms[name] * 1e-9:6.0f} {ms['sdpa cudnn'] / ms[name]:.3f}x{spread}")
        print(f"d{D} N{N} B{B} H{H} {'causal' if causal else 'full':6} {mod if mod != 'plain' else '':7} "
              + " ".join(f"{c:>16}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
