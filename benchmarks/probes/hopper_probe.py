"""Probe: flashlib's FA3 forward for Hopper (flashlib/kernels/fa3_fwd.py) on an H100/H200.

For each kernel variant (``fa3_fwd.VARIANTS``) in its own subprocess, so that a deadlocked kernel
is reported and killed instead of stopping the run:

1. correctness against the float64 oracle (``attention_ref``) with flashlib's tolerance rule
   (``flashlib.testing``: 2x a naive implementation's error in the same dtype, or 4 ulps at the
   scale of the summed terms) on fresh random inputs: irregular lengths, grouped heads, causal
   and not, a causal case with Nq > Nk (rows with no key), Nq = 1, a single key, large logits
   (q x 20), q/k/v as strided (B, N, H, D) views; float16 and bfloat16; head dims 64 and 128.
   Prints the max error / tolerance ratio of out and lse per case (<= 1 passes);
2. unless --quick: forward TFLOP/s (do_bench, 4 B H Nq Nk D, halved for causal) at B x N = 32k
   tokens, H x D = 2048, N in {4096, 16384}, causal and not, float16, for each (head dim, causal)
   whose correctness passed; a variant failing there is not timed.

Then (unless --quick), in one more subprocess, the baselines at the same shapes: flashlib's portable
``fa2_forward`` (autotuned unless FLASHLIB_AUTOTUNE=0, as the environment says), SDPA's flash
backend and SDPA's cuDNN backend; and a table with every TFLOP/s and its ratio to cuDNN.

    PYTHONPATH=$PWD python benchmarks/probes/hopper_probe.py OUTDIR [--quick] [--variants a,b] [--timeout S]

--timeout: seconds a subprocess may go without printing before it is taken as hung and killed
(default 60; the precompile and the baselines get 3x: autotuning prints nothing while it
compiles). --budget: seconds for the variants (default 300), the rest are skipped. --workers:
processes that compile every kernel first, in parallel (default: up to 16; 0: none). Writes to
OUTDIR: probe.log (everything printed), <variant>.jsonl and baselines.jsonl (one record per
check or timing), summary.json and table.txt.
"""
import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.abspath(__file__)
# (B, Hq, Hkv, Nq, Nk, causal list, what): D and dtype are looped over
CHECK_SHAPES = [
    (2, 6, 2, 1000, 1531, (False, True), "irregular, GQA 3:1, ring wraps"),
    (1, 2, 1, 77, 77, (False, True), "one block, rows past Nq in the CTA"),
    (1, 3, 3, 300, 130, (False, True), "Nq > Nk (causal: rows with no key)"),
    (2, 4, 2, 1, 700, (False, True), "Nq = 1"),
    (1, 2, 2, 64, 1, (False,), "a single key"),
]
LARGE_LOGITS = (1, 4, 2, 513, 1041, (False, True), "large logits: q x 20")
STRIDED = (2, 4, 2, 333, 517, (False, True), "q, k, v strided (B, N, H, D) views")
TIMING_TOKENS, TIMING_HD, TIMING_N = 32768, 2048, (4096, 16384)


def timing_shapes(head_dims=(64, 128)):
    """(B, H, N, D, causal) of the timed problems."""
    return [(TIMING_TOKENS // N, TIMING_HD // D, N, D, causal)
            for D in head_dims for N in TIMING_N for causal in (False, True)]


def flops(B, H, N, D, causal):
    from flashlib.kernels.versions import attention_flops   # imported in the children only
    return attention_flops(B, H, N, N, D, causal=causal)


# ----------------------------------------------------------------------------- children


def _emit(records, fh, **rec):
    records.append(rec)
    fh.write(json.dumps(rec) + "\n")
    fh.flush()


def _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, *, strided=False, q_scale=1.0):
    import torch
    if strided:   # (B, N, H, D) storage, viewed as (B, H, N, D): row stride H * D
        q = torch.randn(B, Nq, Hq, D, dtype=dtype, device="cuda").transpose(1, 2)
        k, v = (torch.randn(B, Nk, Hkv, D, dtype=dtype, device="cuda").transpose(1, 2) for _ in range(2))
    else:
        q = torch.randn(B, Hq, Nq, D, dtype=dtype, device="cuda")
        k, v = (torch.randn(B, Hkv, Nk, D, dtype=dtype, device="cuda") for _ in range(2))
    if q_scale != 1.0:
        q = (q.float() * q_scale).to(dtype)
    return q, k, v


def _ratios(out, lse, q, k, v, causal):
    """(out error / tolerance, lse error / tolerance, verdict or None): flashlib.testing's rule."""
    import torch
    from flashlib import testing
    from flashlib.reference import attention_naive, attention_ref
    with torch.no_grad():
        ref, ref_lse = attention_ref(q, k, v, causal=causal)
        base = attention_naive(q, k, v, causal=causal)
        mags = testing.attention_magnitudes(q, k, v, causal=causal)
    r_out = testing.max_error(out, ref) / testing.tolerance(ref, base, q.dtype, magnitude=mags["out"])
    r_lse = testing.max_error(lse, ref_lse) / testing.tolerance(ref_lse, ref_lse.float(), torch.float32,
                                                                magnitude=mags["lse"])
    try:
        testing.assert_attention_close(out, lse, q, k, v, causal=causal, reference=(ref, ref_lse))
        verdict = None
    except AssertionError as e:
        verdict = str(e)
    return r_out, r_lse, verdict


def _spot_check(out, lse, q, k, v, causal):
    """Max |error| of out and lse on heads (0, 0) and (B-1, H-1) against float32 attention."""
    import torch
    errs = [0.0, 0.0]
    for b, h in ((0, 0), (q.shape[0] - 1, q.shape[1] - 1)):
        qh, kh, vh = (t[b, h].float() for t in (q, k, v))
        s = qh @ kh.T / q.shape[-1] ** 0.5
        if causal:   # Nq == Nk here: bottom-right is the usual mask
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        ref_lse = torch.logsumexp(s, -1)
        ref = torch.softmax(s, -1) @ vh
        errs[0] = max(errs[0], (out[b, h].float() - ref).abs().max().item())
        errs[1] = max(errs[1], (lse[b, h] - ref_lse).abs().max().item())
        del s
    return errs


def precompile_one(task):
    """Compile one fa3 kernel into Triton's cache (JIT warmup: no launch), in a pool worker."""
    name, D, causal, dtype_name = task
    try:
        import torch

        import flashlib  # noqa: F401
        from flashlib.kernels import fa3_fwd, score_mod
        dtype = getattr(torch, dtype_name)
        config = fa3_fwd.kernel_config(name, D)
        q = torch.empty(1, 2, 256, D, dtype=dtype)
        k = torch.empty(1, 1, 256, D, dtype=dtype)
        lse = torch.empty(1, 2, 256, dtype=torch.float32)
        t0 = time.time()
        fa3_fwd._fa3_fwd_kernel.warmup(
            fa3_fwd.descriptor(q, (1, 1, fa3_fwd.BLOCK_M, D)),
            fa3_fwd.descriptor(k, (1, 1, config["BLOCK_N"], D)),
            fa3_fwd.descriptor(k, (1, 1, config["BLOCK_N"], D)),
            fa3_fwd.descriptor(q, (1, 1, fa3_fwd.BLOCK_M, D)), lse, lse, lse, q, lse, lse,
            2, 256, 256, 0.1, 2, 1, q.stride(2), q.stride(1), 0, 0,
            grid=(1,), CAUSAL=causal, SCORE_MOD=score_mod.identity, ALIBI_SPLIT=False, VARLEN=False,
            MAX_SEQS=128, FOLD=fa3_fwd._fold(score_mod.identity, 0.1), **config,
            **fa3_fwd.launch_options(name))
        return f"{name} d{D} causal={causal} {dtype_name}: {time.time() - t0:.1f} s"
    except Exception as e:  # noqa: BLE001  (only a head start; the variant's run compiles anyway)
        return f"{name} d{D} causal={causal} {dtype_name}: FAILED {type(e).__name__}: {str(e)[:300]}"


def child_precompile(names, workers):
    """Warm Triton's cache with every kernel the variants will launch, in parallel processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from flashlib.kernels import fa3_fwd
    tasks = [(n, D, c, dt) for n in names for D in fa3_fwd.VARIANTS[n].head_dims
             for c in (False, True) for dt in ("float16", "bfloat16")]
    t0 = time.time()
    # spawn, not fork: this process has initialised CUDA (importing flashlib asks torch for GPUs)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(precompile_one, tasks):
            print(f"[precompile] {line}", flush=True)
    print(f"[precompile] {len(tasks)} kernels in {time.time() - t0:.0f} s", flush=True)


def child_variant(name, outdir, quick):
    import torch
    import triton
    import triton.testing

    import flashlib  # noqa: F401  (runtime first)
    from flashlib.kernels import fa3_fwd

    variant = fa3_fwd.VARIANTS[name]
    records = []
    fh = open(os.path.join(outdir, f"{name}.jsonl"), "w")
    print(f"[{name}] {variant.about}; head dims {variant.head_dims}; triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    failed = set()   # (D, causal) with a failed check: not timed
    cases = [s + (False, 1.0) for s in CHECK_SHAPES] + [LARGE_LOGITS + (False, 20.0), STRIDED + (True, 1.0)]
    for D in variant.head_dims:
        for dtype in (torch.float16, torch.bfloat16):
            for B, Hq, Hkv, Nq, Nk, causals, what, strided, q_scale in cases:
                for causal in causals:
                    tag = (f"[{name}] d{D} {str(dtype)[6:]:8} {(B, Hq, Hkv, Nq, Nk)!s:26} "
                           f"causal={causal!s:5} {what}")
                    print(f"{tag} ...", flush=True)
                    torch.manual_seed(hash((B, Hq, Nq, Nk, D, causal)) % 1000)
                    rec = dict(kind="check", variant=name, D=D, dtype=str(dtype)[6:],
                               shape=[B, Hq, Hkv, Nq, Nk], causal=causal, what=what)
                    try:
                        q, k, v = _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, strided=strided, q_scale=q_scale)
                        assert fa3_fwd.supported(q, k, v), "fa3_fwd.supported() is False for these inputs"
                        t0 = time.perf_counter()
                        out, lse = fa3_fwd.fa3_forward(q, k, v, causal=causal, variant=name)
                        torch.cuda.synchronize()
                        rec["first_call_s"] = round(time.perf_counter() - t0, 2)
                        r_out, r_lse, verdict = _ratios(out, lse, q, k, v, causal)
                        rec.update(out_ratio=r_out, lse_ratio=r_lse, ok=verdict is None, error=verdict)
                        print(f"{tag}: out err/tol {r_out:.3f}, lse err/tol {r_lse:.3f} "
                              f"{'ok' if verdict is None else 'FAIL: ' + verdict}", flush=True)
                    except Exception as e:  # noqa: BLE001  (report, go on with the next case)
                        rec.update(ok=False, error=f"{type(e).__name__}: {e}")
                        print(f"{tag}: EXCEPTION {type(e).__name__}: {e}", flush=True)
                        traceback.print_exc()
                        sys.stdout.flush()
                    if not rec["ok"]:
                        failed.add((D, causal))
                    _emit(records, fh, **rec)
    n_ok = sum(r["ok"] for r in records)
    print(f"[{name}] correctness: {n_ok}/{len(records)} cases pass", flush=True)
    if quick:
        return
    for B, H, N, D, causal in timing_shapes(variant.head_dims):
        tag = f"[{name}] time B={B} H={H} N={N} d{D} causal={causal!s:5}"
        if (D, causal) in failed:
            print(f"{tag}: skipped (a correctness check failed)", flush=True)
            continue
        print(f"{tag} ...", flush=True)
        rec = dict(kind="time", impl=f"fa3:{name}", B=B, H=H, N=N, D=D, causal=causal)
        try:
            q, k, v = (torch.randn(B, H, N, D, dtype=torch.float16, device="cuda") for _ in range(3))
            out, lse = fa3_fwd.fa3_forward(q, k, v, causal=causal, variant=name)
            # the timed shape (the ring wraps N / block_n times) against float32 on two heads
            rec["out_err"], rec["lse_err"] = _spot_check(out, lse, q, k, v, causal)
            suspicious = rec["out_err"] > 1e-2 or rec["lse_err"] > 1e-2
            ms = triton.testing.do_bench(lambda: fa3_fwd.fa3_forward(q, k, v, causal=causal, variant=name))
            rec.update(ms=ms, tflops=flops(B, H, N, D, causal) / (ms * 1e-3) / 1e12, suspicious=suspicious)
            print(f"{tag}: {ms:.3f} ms, {rec['tflops']:.1f} TFLOP/s (heads (0,0), (B-1,H-1) against "
                  f"float32: max |out err| {rec['out_err']:.1e}, |lse err| {rec['lse_err']:.1e}"
                  f"{', SUSPICIOUS' if suspicious else ''})", flush=True)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {e}"
            print(f"{tag}: EXCEPTION {rec['error']}", flush=True)
        _emit(records, fh, **rec)


def child_baselines(outdir):
    import torch
    import triton.testing

    import flashlib  # noqa: F401
    from flashlib import runtime
    from flashlib.bench.harness import sdpa as sdpa_backend
    from flashlib.kernels.fa2_fwd import fa2_forward

    impls = {"fa2 (flashlib)": lambda q, k, v, causal: fa2_forward(q, k, v, causal=causal),
             "sdpa flash": sdpa_backend("sdpa_flash"), "sdpa cudnn": sdpa_backend("sdpa_cudnn")}
    print(f"[baselines] FLASHLIB_AUTOTUNE={os.environ.get('FLASHLIB_AUTOTUNE', '(unset: 1)')} "
          f"(autotune {'on' if runtime.autotuning(runtime.OPTIONS) else 'off'}), torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    records = []
    fh = open(os.path.join(outdir, "baselines.jsonl"), "w")
    for B, H, N, D, causal in timing_shapes():
        q, k, v = (torch.randn(B, H, N, D, dtype=torch.float16, device="cuda") for _ in range(3))
        for impl, fn in impls.items():
            tag = f"[baselines] {impl:15} B={B} H={H} N={N} d{D} causal={causal!s:5}"
            print(f"{tag} ...", flush=True)
            rec = dict(kind="time", impl=impl, B=B, H=H, N=N, D=D, causal=causal)
            try:
                fn(q, k, v, causal)   # first call: compile / autotune outside the timing
                ms = triton.testing.do_bench(lambda: fn(q, k, v, causal))
                rec.update(ms=ms, tflops=flops(B, H, N, D, causal) / (ms * 1e-3) / 1e12)
                print(f"{tag}: {ms:.3f} ms, {rec['tflops']:.1f} TFLOP/s", flush=True)
            except Exception as e:  # noqa: BLE001  (e.g. a backend without this configuration)
                rec["error"] = f"{type(e).__name__}: {e}"
                print(f"{tag}: EXCEPTION {rec['error'][:300]}", flush=True)
            _emit(records, fh, **rec)


# ----------------------------------------------------------------------------- parent


class Tee:
    def __init__(self, path):
        self.f = open(path, "a")

    def __call__(self, line=""):
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def run_child(args, idle_timeout, log, env=None):
    """Run this script with ``args`` in a new process group; stream its output into the log. Kill
    it (its group only) when it prints nothing for ``idle_timeout`` s. Returns (status, seconds)."""
    cmd = [sys.executable, "-u", HERE, *args]
    root = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env or {})})
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    last = "(nothing)"
    while True:
        try:
            line = lines.get(timeout=idle_timeout)
        except queue.Empty:
            log(f"!!! TIMEOUT: no output for {idle_timeout} s; last line: {last.strip()}")
            log("!!! taken as a hang (deadlocked kernel?); killing this subprocess")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            return "hang", time.time() - t0
        if line is None:
            break
        last = line
        log(line.rstrip("\n"))
    rc = proc.wait()
    return ("ok" if rc == 0 else f"exit {rc}"), time.time() - t0


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def table(records, log, value="tflops", what="forward"):
    """``value`` (TFLOP/s) per (D, N, causal) and implementation, with the ratio to cuDNN."""
    times = [r for r in records if r.get("kind") == "time" and value in r]
    impls = list(dict.fromkeys(r["impl"] for r in times))
    keys = sorted({(r["D"], r["N"], r["causal"]) for r in times})
    by = {(r["impl"], r["D"], r["N"], r["causal"]): r[value] for r in times}
    heads = ["d%d %dk %s" % (D, N // 1024, "causal" if c else "full") for D, N, c in keys]
    lines = [f"{what} TFLOP/s and ratio to sdpa cudnn; float16, B x N = 32k tokens, H x D = 2048",
             f"{'impl':22}" + "".join(f"{h:>16}" for h in heads)]
    for impl in impls:
        cells = []
        for D, N, c in keys:
            t = by.get((impl, D, N, c))
            ref = by.get(("sdpa cudnn", D, N, c))
            cell = "-" if t is None else f"{t:.0f} {t / ref:.2f}x" if ref else f"{t:.0f}"
            cells.append(f"{cell:>16}")
        lines.append(f"{impl:22}" + "".join(cells))
    for line in lines:
        log(line)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--quick", action="store_true", help="correctness only: no timings, no baselines")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds without output before a subprocess is killed as hung")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds for the variants (after it, the remaining ones are skipped)")
    ap.add_argument("--variants", default=None, help="comma-separated fa3_fwd.VARIANTS keys (default all)")
    ap.add_argument("--child-variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-baselines", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-precompile", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 4),
                    help="processes compiling the kernels before the runs (0: no precompile)")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    if args.child_variant:
        return child_variant(args.child_variant, args.outdir, args.quick)
    if args.child_baselines:
        return child_baselines(args.outdir)
    if args.child_precompile:
        return child_precompile(args.child_precompile.split(","), args.workers)

    log = Tee(os.path.join(args.outdir, "probe.log"))
    t_start = time.time()
    log(f"hopper_probe: writing to {os.path.abspath(args.outdir)}; quick={args.quick}, "
        f"idle timeout {args.timeout:.0f} s, "
        f"FLASHLIB_AUTOTUNE={os.environ.get('FLASHLIB_AUTOTUNE', '(unset)')}")
    try:
        import torch
        import triton
        log(f"torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}, "
            f"gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else 'NONE'}")
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
        from flashlib.kernels import fa3_fwd
        names = args.variants.split(",") if args.variants else list(fa3_fwd.VARIANTS)
        log(f"gluon hopper available: {fa3_fwd._GLUON}; variants: {', '.join(names)}")
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())
        return 1

    status = {}
    if args.workers > 0:
        # every kernel compiled up front, in parallel; the variants' runs then find them cached
        log("=== precompile")
        status["precompile"] = run_child(["--child-precompile", ",".join(names), "--workers",
                                          str(args.workers), args.outdir], 3 * args.timeout, log)
        log(f"=== precompile: {status['precompile'][0]} ({status['precompile'][1]:.0f} s)")
    for name in names:
        if time.time() - t_start > args.budget:
            status[name] = ("skipped (--budget)", 0.0)
            log(f"=== variant {name}: skipped, over the {args.budget:.0f} s budget")
            continue
        log(f"=== variant {name}")
        # fa3 does not autotune; fa2 only serves as a cross-check there: one config, quick compiles
        status[name] = run_child(["--child-variant", name, args.outdir] + (["--quick"] if args.quick else []),
                                 args.timeout, log, env={"FLASHLIB_AUTOTUNE": "0"})
        log(f"=== variant {name}: {status[name][0]} ({status[name][1]:.0f} s)")
    if not args.quick:
        log("=== baselines")
        status["baselines"] = run_child(["--child-baselines", args.outdir], 3 * args.timeout, log)
        log(f"=== baselines: {status['baselines'][0]} ({status['baselines'][1]:.0f} s)")

    records = []
    for name in names + ([] if args.quick else ["baselines"]):
        records += read_jsonl(os.path.join(args.outdir, f"{name}.jsonl"))
    log("")
    log("=== correctness (max err/tol over the cases; <= 1 passes)")
    for name in names:
        checks = [r for r in records if r.get("kind") == "check" and r.get("variant") == name]
        bad = [r for r in checks if not r["ok"]]
        worst = max((max(r.get("out_ratio", 0), r.get("lse_ratio", 0)) for r in checks if "out_ratio" in r),
                    default=float("nan"))
        first = ""
        if bad:
            b = bad[0]
            first = (f"; first failure: d{b['D']} {b['dtype']} {b['shape']} causal={b['causal']}: "
                     f"{(b.get('error') or '')[:200]}")
        log(f"{name:14} {status[name][0]:8} {len(checks) - len(bad):3}/{len(checks):<3} pass, "
            f"worst ratio {worst:.3f}{first}")
    text = ""
    if not args.quick:
        log("")
        text = table(records, log)
    with open(os.path.join(args.outdir, "table.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.outdir, "summary.json"), "w") as f:
        json.dump({"status": status, "records": records}, f, indent=1)
    log(f"done in {time.time() - t_start:.0f} s; results in {os.path.abspath(args.outdir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
