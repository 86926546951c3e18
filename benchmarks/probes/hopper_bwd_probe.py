"""Probe: flashlib's FA3 backward for Hopper (flashlib/kernels/fa3_bwd.py) on an H100/H200.

For each kernel variant (``fa3_bwd.VARIANTS``) in its own subprocess, so that a deadlocked kernel
is reported and killed instead of stopping the run:

1. correctness of dq, dk, dv against float64 autograd through the oracle (``attention_ref``)
   with flashlib's tolerance rule (``flashlib.testing``: 2x a naive implementation's error in
   the same dtype, or 4 ulps at the scale of the summed terms, ``attention_magnitudes``) on fresh
   random inputs: ragged lengths (1000/3000), grouped heads, causal and not, causal with Nq > Nk
   (rows with no key: their gradients must be 0, never NaN), Nq = 1, Nk = 1, large logits
   (q x 20), q/k/v/dout as strided (B, N, H, D) views; float16 and bfloat16; head dims 64 and
   128. (out, lse) come from ``fa2_forward``. Then the score modifiers (``MOD_CASES``: softcap,
   ALiBi with slopes per (batch, head), both; ragged, grouped, causal with Nq > Nk, past tanh's
   bend, strided), (out, lse) from ``fa3_forward`` with the same modifier, against the oracle
   with it. Prints each gradient's max error / tolerance (<= 1 passes) and the largest
   difference from ``fa2_backward`` on the same inputs;
2. unless --quick: forward+backward and backward-only TFLOP/s (do_bench medians; the backward
   counts 2.5x the forward's 4 B H Nq Nk D, halved for causal) at B x N = 32k tokens, H x D =
   2048, N in {4096, 16384}, causal and not, float16, for each (head dim, causal) whose checks
   passed. The forward is flashlib's (``fa3_forward`` where it runs, else ``fa2_forward``).
   With --mods also the softcap (``production.SOFTCAP``) and ALiBi (``production.alibi_slopes``),
   with their backward's ratio to the plain one.

Then (unless --quick), in one more subprocess, the baselines at the same shapes: flashlib's
``fa2_backward`` (same forward), SDPA's flash backend and SDPA's cuDNN backend (autograd; their
backward-only time is fwd+bwd minus a timed forward); and a table of TFLOP/s with the ratio to
cuDNN.

    PYTHONPATH=$PWD python benchmarks/probes/hopper_bwd_probe.py OUTDIR [--quick] [--mods] [--variants a,b] [--timeout S]

--timeout: seconds a subprocess may go without printing before it is taken as hung and killed
(default 90; the baselines get 3x). --budget: seconds for the variants (default 600), the rest
are skipped. Writes to OUTDIR: probe.log (everything printed), <variant>.jsonl and
baselines.jsonl (one record per check or timing), summary.json and table.txt.
"""
import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
import hopper_probe  # noqa: E402  (the forward probe's harness: log, subprocess with hang guard)
from hopper_probe import Tee, read_jsonl  # noqa: E402

# (B, Hq, Hkv, Nq, Nk, causal list, what, strided, q_scale): D and dtype are looped over
CHECK_CASES = [
    (2, 6, 2, 1000, 3000, (False, True), "ragged 1000/3000, GQA 3:1", False, 1.0),
    (1, 4, 4, 3000, 1000, (False, True), "ragged 3000/1000 (causal: rows with no key)", False, 1.0),
    (1, 3, 3, 300, 130, (True,), "Nq > Nk causal", False, 1.0),
    (1, 2, 1, 77, 77, (False, True), "one block, rows past Nq", False, 1.0),
    (2, 4, 2, 1, 700, (False, True), "Nq = 1", False, 1.0),
    (1, 2, 2, 64, 1, (False, True), "Nk = 1 (exact dq = 0)", False, 1.0),
    (1, 4, 2, 513, 1041, (False, True), "large logits: q x 20", False, 20.0),
    (2, 4, 2, 333, 517, (False, True), "q, k, v, dout strided (B, N, H, D) views", True, 1.0),
]
# as CHECK_CASES, then the score modifiers: the softcap's cap, ALiBi (slopes per (batch, head))
MOD_CASES = [
    (2, 6, 2, 1000, 3000, (False, True), "softcap 3, ragged, GQA 3:1", False, 1.0, dict(softcap=3.0)),
    (2, 6, 2, 1000, 3000, (False, True), "ALiBi, ragged, GQA 3:1", False, 1.0, dict(alibi=True)),
    (1, 4, 4, 3000, 1000, (True,), "softcap 3 + ALiBi, Nq > Nk causal", False, 1.0,
     dict(softcap=3.0, alibi=True)),
    (1, 4, 2, 513, 1041, (False, True), "softcap 30 past tanh's bend: q x 5", False, 5.0, dict(softcap=30.0)),
    (2, 4, 2, 333, 517, (False, True), "softcap 3 + ALiBi, strided views", True, 1.0,
     dict(softcap=3.0, alibi=True)),
]


timing_shapes, fwd_flops, _emit = hopper_probe.timing_shapes, hopper_probe.flops, hopper_probe._emit


def _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, *, strided=False, q_scale=1.0):
    import torch

    def make(H, N):
        if strided:   # (B, N, H, D) storage, viewed as (B, H, N, D): row stride H * D
            return torch.randn(B, N, H, D, dtype=dtype, device="cuda").transpose(1, 2)
        return torch.randn(B, H, N, D, dtype=dtype, device="cuda")
    q, k, v, dout = make(Hq, Nq), make(Hkv, Nk), make(Hkv, Nk), make(Hq, Nq)
    if q_scale != 1.0:
        q = (q.float() * q_scale).to(dtype)
    return q, k, v, dout


def _forward(q, k, v, causal, mod=None):
    """flashlib's forward: fa3 where it runs, else fa2 (the backward's saved out and lse); mod: a
    ``kernels.score_mod.ScoreMod`` or None."""
    from flashlib.kernels import fa3_fwd
    from flashlib.kernels.fa2_fwd import fa2_forward
    if fa3_fwd.supported(q, k, v):
        return fa3_fwd.fa3_forward(q, k, v, causal=causal, score_mod=mod)
    return fa2_forward(q, k, v, causal=causal, score_mod=mod)


def score_mods(spec, B, Hq):
    """The oracle's and ``score_mod.make``'s options for a case's modifiers: ALiBi's slopes per
    (batch, head), Press et al.'s over the heads (``production.alibi_slopes``) times a factor from
    0.5 to 1.5 over the batch."""
    import torch
    from flashlib.bench import production as prod
    options = {name: value for name, value in spec.items() if name != "alibi"}
    if spec.get("alibi"):
        options["alibi_slopes"] = (prod.alibi_slopes(Hq) * torch.linspace(0.5, 1.5, B)[:, None]).cuda()
    return options


def grad_ratios(grads, q, k, v, dout, causal, **mods):
    """{name: max error / tolerance} of (dq, dk, dv) and a verdict (None: all pass), against
    float64 autograd through attention_ref; the baseline is autograd through attention_naive
    in q's dtype (flashlib.testing's rule, as tests/test_flash_attention.py applies it). mods:
    ``softcap``, ``alibi_slopes`` as in attention_ref."""
    import torch
    from flashlib import testing
    from flashlib.reference import attention_naive, attention_ref
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*ref_leaves, causal=causal, **mods)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double())
    base_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base = attention_naive(*base_leaves, causal=causal, **mods)
    base_grads = torch.autograd.grad(base, base_leaves, dout)
    mags = testing.attention_magnitudes(q, k, v, dout, causal=causal, **mods)
    ratios, verdicts = {}, []
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        if g.shape != r.shape or g.dtype != q.dtype:
            verdicts.append(f"{name}: {tuple(g.shape)} {g.dtype}, expected {tuple(r.shape)} {q.dtype}")
            continue
        if not torch.isfinite(g).all():
            verdicts.append(f"{name}: {int((~torch.isfinite(g)).sum())} non-finite entries")
        tol = testing.tolerance(r, b, q.dtype, magnitude=mags[name])
        ratios[name] = testing.max_error(g, r) / tol if tol > 0 else float("inf")
        if not ratios[name] <= 1.0:
            verdicts.append(f"{name}: max error {testing.max_error(g, r):.3g} over the tolerance {tol:.3g}")
    return ratios, ("; ".join(verdicts) or None)


def child_variant(name, outdir, quick, mods=False):
    import torch
    import triton
    import triton.testing

    import flashlib  # noqa: F401  (runtime first)
    from flashlib.bench import production as prod
    from flashlib.kernels import fa3_bwd, score_mod
    from flashlib.kernels.fa2_bwd import fa2_backward

    variant = fa3_bwd.VARIANTS[name]
    records = []
    fh = open(os.path.join(outdir, f"{name}.jsonl"), "w")
    print(f"[{name}] {variant.about}; head dims {variant.head_dims}; triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    failed = set()   # (D, causal, "softcap+alibi", "alibi", ... or "") with a failed check: not timed
    for D in variant.head_dims:
        config = fa3_bwd.kernel_config(name, D)
        print(f"[{name}] d{D}: {config}", flush=True)
        for dtype in (torch.float16, torch.bfloat16):
            for B, Hq, Hkv, Nq, Nk, causals, what, strided, q_scale, spec in (
                    [(*case, {}) for case in CHECK_CASES] + MOD_CASES):
                for causal in causals:
                    tag = (f"[{name}] d{D} {str(dtype)[6:]:8} {(B, Hq, Hkv, Nq, Nk)!s:26} "
                           f"causal={causal!s:5} {what}")
                    print(f"{tag} ...", flush=True)
                    torch.manual_seed(hash((B, Hq, Nq, Nk, D, causal)) % 1000)
                    rec = dict(kind="check", variant=name, D=D, dtype=str(dtype)[6:],
                               shape=[B, Hq, Hkv, Nq, Nk], causal=causal, what=what, mods="+".join(spec))
                    try:
                        q, k, v, dout = _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, strided=strided, q_scale=q_scale)
                        options = score_mods(spec, B, Hq)
                        mod = score_mod.make(q, score_mod.Modifiers(**options))
                        out, lse = _forward(q, k, v, causal, mod)
                        assert fa3_bwd.supported(q, k, v, out, lse, dout), "fa3_bwd.supported() is False"
                        t0 = time.perf_counter()
                        grads = fa3_bwd.fa3_backward(q, k, v, out, lse, dout, causal=causal, variant=name,
                                                     score_mod=mod)
                        torch.cuda.synchronize()
                        rec["first_call_s"] = round(time.perf_counter() - t0, 2)
                        fa2 = fa2_backward(q, k, v, out, lse, dout, causal=causal, score_mod=mod)
                        rec["vs_fa2"] = max((a.float() - b.float()).abs().max().item() if a.numel() else 0.0
                                            for a, b in zip(grads, fa2))
                        ratios, verdict = grad_ratios(grads, q, k, v, dout, causal, **options)
                        rec.update(ratios=ratios, ok=verdict is None, error=verdict)
                        shown = ", ".join(f"{n} {r:.3f}" for n, r in ratios.items())
                        print(f"{tag}: err/tol {shown}; max |fa3 - fa2| {rec['vs_fa2']:.2e} "
                              f"{'ok' if verdict is None else 'FAIL: ' + verdict}", flush=True)
                    except Exception as e:  # noqa: BLE001  (report, go on with the next case)
                        rec.update(ok=False, error=f"{type(e).__name__}: {e}")
                        print(f"{tag}: EXCEPTION {type(e).__name__}: {e}", flush=True)
                        traceback.print_exc()
                        sys.stdout.flush()
                    if not rec["ok"]:
                        failed.add((D, causal, "+".join(spec)))
                    _emit(records, fh, **rec)
    n_ok = sum(r["ok"] for r in records)
    print(f"[{name}] correctness: {n_ok}/{len(records)} cases pass", flush=True)
    if quick:
        return
    for B, H, N, D, causal in timing_shapes(variant.head_dims):
        plain_ms = None
        # the plain scores, then (--mods) the production suite's softcap and ALiBi (slopes per head)
        timed = {"": {}, "softcap": dict(softcap=prod.SOFTCAP),
                 "alibi": dict(alibi_slopes=prod.alibi_slopes(H).cuda())} if mods else {"": {}}
        for label, options in timed.items():
            tag = f"[{name}] time B={B} H={H} N={N} d{D} causal={causal!s:5} {label or 'plain'}"
            if any((d, c) == (D, causal) and label in m.split("+") for d, c, m in failed):
                print(f"{tag}: skipped (a correctness check failed)", flush=True)
                continue
            print(f"{tag} ...", flush=True)
            rec = dict(kind="time", impl=f"fa3:{name} {label}".strip(), B=B, H=H, N=N, D=D, causal=causal)
            try:
                q, k, v, dout = (torch.randn(B, H, N, D, dtype=torch.float16, device="cuda") for _ in range(4))
                _time_variant(rec, name, q, k, v, dout, causal, score_mod.make(q, score_mod.Modifiers(**options)))
                plain_ms = rec["bwd_ms"] if not label else plain_ms
                vs_plain = f", {plain_ms / rec['bwd_ms']:.3f}x plain's bwd" if label and plain_ms else ""
                print(f"{tag}: bwd {rec['bwd_ms']:.3f} ms {rec['bwd_tflops']:.1f} TFLOP/s{vs_plain}, fwd+bwd "
                      f"{rec['fwd_bwd_ms']:.3f} ms {rec['fwd_bwd_tflops']:.1f} TFLOP/s (max |fa3 - fa2| "
                      f"{rec['vs_fa2']:.1e}{', NaN' if rec['nan'] else ''}"
                      f"{', SUSPICIOUS' if rec['suspicious'] else ''})", flush=True)
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {e}"
                print(f"{tag}: EXCEPTION {rec['error']}", flush=True)
            _emit(records, fh, **rec)


def _time_variant(rec, name, q, k, v, dout, causal, mod):
    """Time fa3_backward's ``name`` on these inputs with the score modifier ``mod`` (its forward
    with the same), after comparing it with fa2_backward on them (the ring wraps N / 64 times)."""
    import torch
    from flashlib.kernels import fa3_bwd
    from flashlib.kernels.fa2_bwd import fa2_backward
    B, H, N, D = q.shape
    out, lse = _forward(q, k, v, causal, mod)

    def bwd():
        return fa3_bwd.fa3_backward(q, k, v, out, lse, dout, causal=causal, variant=name, score_mod=mod)

    def fwd_bwd():
        o, s = _forward(q, k, v, causal, mod)
        return fa3_bwd.fa3_backward(q, k, v, o, s, dout, causal=causal, variant=name, score_mod=mod)
    ref = fa2_backward(q, k, v, out, lse, dout, causal=causal, score_mod=mod)
    rec["vs_fa2"] = max((a.float() - b.float()).abs().max().item() for a, b in zip(bwd(), ref))
    rec["nan"] = any(not torch.isfinite(g).all().item() for g in bwd())
    del ref
    _time(rec, bwd, fwd_bwd, B, H, N, D, causal)
    rec["suspicious"] = rec["nan"] or rec["vs_fa2"] > 5e-2


def _time(rec, bwd, fwd_bwd, B, H, N, D, causal, fwd=None):
    """do_bench medians of the backward (or fwd+bwd minus fwd) and of fwd+bwd, with TFLOP/s."""
    import triton.testing
    flops = fwd_flops(B, H, N, D, causal)
    rec["fwd_bwd_ms"] = triton.testing.do_bench(fwd_bwd)
    if bwd is not None:
        rec["bwd_ms"] = triton.testing.do_bench(bwd)
    else:   # autograd backends: the backward alone is not callable without its forward
        rec["fwd_ms"] = triton.testing.do_bench(fwd)
        rec["bwd_ms"] = rec["fwd_bwd_ms"] - rec["fwd_ms"]
    rec["bwd_tflops"] = 2.5 * flops / (rec["bwd_ms"] * 1e-3) / 1e12
    rec["fwd_bwd_tflops"] = 3.5 * flops / (rec["fwd_bwd_ms"] * 1e-3) / 1e12


def child_baselines(outdir):
    import torch

    import flashlib  # noqa: F401
    from flashlib import runtime
    from flashlib.bench.harness import sdpa as sdpa_backend
    from flashlib.kernels.fa2_bwd import fa2_backward

    print(f"[baselines] FLASHLIB_AUTOTUNE={os.environ.get('FLASHLIB_AUTOTUNE', '(unset: 1)')} "
          f"(autotune {'on' if runtime.autotuning(runtime.OPTIONS) else 'off'}), torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    records = []
    fh = open(os.path.join(outdir, "baselines.jsonl"), "w")
    for B, H, N, D, causal in timing_shapes():
        q, k, v, dout = (torch.randn(B, H, N, D, dtype=torch.float16, device="cuda") for _ in range(4))
        out, lse = _forward(q, k, v, causal)
        impls = {"fa2_backward": None, "sdpa flash": sdpa_backend("sdpa_flash"), "sdpa cudnn": sdpa_backend("sdpa_cudnn")}
        for impl, sdpa in impls.items():
            tag = f"[baselines] {impl:13} B={B} H={H} N={N} d{D} causal={causal!s:5}"
            print(f"{tag} ...", flush=True)
            rec = dict(kind="time", impl=impl, B=B, H=H, N=N, D=D, causal=causal)
            try:
                if sdpa is None:
                    def bwd():
                        return fa2_backward(q, k, v, out, lse, dout, causal=causal)

                    def fwd_bwd():
                        o, s = _forward(q, k, v, causal)
                        return fa2_backward(q, k, v, o, s, dout, causal=causal)
                    bwd()   # first call: compile / autotune outside the timing
                    _time(rec, bwd, fwd_bwd, B, H, N, D, causal)
                else:
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

                    def fwd_bwd(sdpa=sdpa, leaves=leaves):
                        return torch.autograd.grad(sdpa(*leaves, causal), leaves, dout)

                    def fwd(sdpa=sdpa, leaves=leaves):
                        with torch.no_grad():
                            return sdpa(*leaves, causal)
                    fwd_bwd()
                    _time(rec, None, fwd_bwd, B, H, N, D, causal, fwd=fwd)
                print(f"{tag}: bwd {rec['bwd_ms']:.3f} ms {rec['bwd_tflops']:.1f} TFLOP/s, fwd+bwd "
                      f"{rec['fwd_bwd_ms']:.3f} ms {rec['fwd_bwd_tflops']:.1f} TFLOP/s", flush=True)
            except Exception as e:  # noqa: BLE001  (e.g. a backend without this configuration)
                rec["error"] = f"{type(e).__name__}: {e}"
                print(f"{tag}: EXCEPTION {rec['error'][:300]}", flush=True)
            _emit(records, fh, **rec)


# ----------------------------------------------------------------------------- parent


def run_child(args, idle_timeout, log, env=None):
    """hopper_probe.run_child (new process group, output streamed to the log, killed after
    ``idle_timeout`` s without output), running this script instead of the forward's."""
    saved, hopper_probe.HERE = hopper_probe.HERE, HERE
    try:
        return hopper_probe.run_child(args, idle_timeout, log, env)
    finally:
        hopper_probe.HERE = saved


def table(records, log):
    """Backward and fwd+bwd TFLOP/s per (D, N, causal) and implementation, ratio to cuDNN."""
    return "\n\n".join(hopper_probe.table(records, log, value, what)
                       for value, what in (("bwd_tflops", "bwd"), ("fwd_bwd_tflops", "fwd_bwd")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--quick", action="store_true", help="correctness only: no timings, no baselines")
    ap.add_argument("--mods", action="store_true",
                    help="also time the softcap and ALiBi (score modifiers) against the plain scores")
    ap.add_argument("--timeout", type=float, default=90.0,
                    help="seconds without output before a subprocess is killed as hung")
    ap.add_argument("--budget", type=float, default=600.0,
                    help="seconds for the variants (after it, the remaining ones are skipped)")
    ap.add_argument("--variants", default=None, help="comma-separated fa3_bwd.VARIANTS keys (default all)")
    ap.add_argument("--child-variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-baselines", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    if args.child_variant:
        return child_variant(args.child_variant, args.outdir, args.quick, args.mods)
    if args.child_baselines:
        return child_baselines(args.outdir)

    log = Tee(os.path.join(args.outdir, "probe.log"))
    t_start = time.time()
    log(f"hopper_bwd_probe: writing to {os.path.abspath(args.outdir)}; quick={args.quick}, "
        f"idle timeout {args.timeout:.0f} s, "
        f"FLASHLIB_AUTOTUNE={os.environ.get('FLASHLIB_AUTOTUNE', '(unset)')}")
    try:
        import torch
        import triton
        log(f"torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}, "
            f"gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else 'NONE'}")
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
        from flashlib.kernels import fa3_bwd
        names = args.variants.split(",") if args.variants else list(fa3_bwd.VARIANTS)
        log(f"gluon hopper available: {fa3_bwd._GLUON}; variants: {', '.join(names)}")
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())
        return 1

    status = {}
    for name in names:
        if time.time() - t_start > args.budget:
            status[name] = ("skipped (--budget)", 0.0)
            log(f"=== variant {name}: skipped, over the {args.budget:.0f} s budget")
            continue
        log(f"=== variant {name}")
        # fa2 serves only as a cross-check there: one config, quick compiles
        flags = (["--quick"] if args.quick else []) + (["--mods"] if args.mods else [])
        status[name] = run_child(["--child-variant", name, args.outdir] + flags, args.timeout, log,
                                 env={"FLASHLIB_AUTOTUNE": "0"})
        log(f"=== variant {name}: {status[name][0]} ({status[name][1]:.0f} s)")
    if not args.quick:
        log("=== baselines")
        status["baselines"] = run_child(["--child-baselines", args.outdir], 3 * args.timeout, log)
        log(f"=== baselines: {status['baselines'][0]} ({status['baselines'][1]:.0f} s)")

    records = []
    for name in names + ([] if args.quick else ["baselines"]):
        records += read_jsonl(os.path.join(args.outdir, f"{name}.jsonl"))
    log("")
    log("=== correctness (max err/tol over the cases and dq, dk, dv; <= 1 passes)")
    for name in names:
        checks = [r for r in records if r.get("kind") == "check" and r.get("variant") == name]
        bad = [r for r in checks if not r["ok"]]
        worst = max((max(r["ratios"].values()) for r in checks if r.get("ratios")), default=float("nan"))
        first = ""
        if bad:
            b = bad[0]
            first = (f"; first failure: d{b['D']} {b['dtype']} {b['shape']} causal={b['causal']}: "
                     f"{(b.get('error') or '')[:200]}")
        log(f"{name:12} {status[name][0]:8} {len(checks) - len(bad):3}/{len(checks):<3} pass, "
            f"worst ratio {worst:.3f}{first}")
    text = "" if args.quick else table(records, log)
    with open(os.path.join(args.outdir, "table.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.outdir, "summary.json"), "w") as f:
        json.dump({"status": status, "records": records}, f, indent=1)
    log(f"done in {time.time() - t_start:.0f} s; results in {os.path.abspath(args.outdir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
