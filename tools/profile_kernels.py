"""Profile FlashAttention kernels on a GPU and write a report the lessons read on a CPU.

For flashlib's FA2 forward (``kernels.fa2_fwd.fa2_forward``, autotuned, as lesson 07 times it) at
d=64 and d=128, exercise 07b's reference kernel (``solutions/ex07b_fa2_kernel.py``, lesson 07's
fixed config 128 x 64, 4 warps, 3 stages), and, for contrast, whatever ``flash_attention`` runs on
this GPU (on Hopper flashlib's FA3 kernel, warp-specialised: lesson 12), each at B=4, H=16,
N=4096, float16, not causal (lesson 07's roofline shape):

- what each kernel was compiled to: registers per thread and spills (the driver's figures, and
  cuobjdump's reading of the cubin beside them: stack frame, local-memory loads and stores in the
  machine code), shared memory per program, warps, stages, the block config;
- occupancy: programs per SM by the CUDA occupancy calculator's rules
  (``flashlib.teach.profile.occupancy``) and by the driver (cuOccupancyMaxActiveBlocksPerMultiprocessor),
  the grid and its waves;
- a torch.profiler trace as a table (kernel, calls, GPU time);
- the time (``triton.testing.do_bench``, its mean), TFLOP/s against the GPU's peak (a float16
  8192^3 matmul measured here, and the datasheet's) and against lesson 07's roofline model;
- with Nsight Compute (``ncu``) where the machine has it: its SpeedOfLight, Occupancy, LaunchStats,
  WarpStateStats and ComputeWorkloadAnalysis sections and a few metrics (tensor and
  special-function pipe use, warp stall reasons) for one call per case in a child process (a
  forward's one kernel launch); without it the report says "ncu not available".

    python tools/profile_kernels.py OUTDIR               # on a GPU: OUTDIR/report.json and report.md
    python tools/profile_kernels.py OUTDIR --no-ncu
    python tools/profile_kernels.py OUTDIR --cases flashlib_fa2_d64   # others kept from OUTDIR's report

Opt-in, by name (issue 57), the same for FA3's backward (``kernels.fa3_bwd.fa3_backward``, not
causal) before (variant ``2wg``) and after (``2wg_split``: dQ's columns split between the consumers;
``wide`` and ``wide_m64``: one consumer of two warpgroups) beside SDPA cuDNN's. flashlib's backward
is timed alone: out and lse (``fa3_forward``) and a random dout are made once; the timed call runs
the backward's kernels (preprocess, main, dQ convert) and the zero fill of its float32 dQ
accumulator. autograd reaches cuDNN's backward only through its forward: its time is forward +
backward less the forward alone (grad enabled, as autograd runs it), each a do_bench mean, and its
torch.profiler table and ncu see both. ncu profiles every launch of the call and reports the
longest, named in the report. Into a folder of its own, so that the lessons' forward report stays:

    python tools/profile_kernels.py benchmarks/results/h200/profile_backward --cases fa3_bwd_2wg_d128 \
        fa3_bwd_2wg_split_d128 sdpa_cudnn_bwd_d128 fa3_bwd_2wg_d64 sdpa_cudnn_bwd_d64 fa3_bwd_wide_d64 \
        fa3_bwd_wide_m64_d128

The committed report lives in benchmarks/results/<gpu>/profile/ (h100, else h200), where lessons 05
and 07 look for it (``flashlib.teach.profile.load_report``). Autotuning results are kept on disk
(flashlib's ``kernels.config.SavedChoices``) so the ncu child runs the config the parent chose; the report records
both configs. Every stage is guarded: a failure is written into the report, not raised.
"""
import argparse
import csv
import datetime
import glob
import io
import json
import math
import os
import shutil
import subprocess
import sys
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script from a clone: flashlib is the clone's
    sys.path.insert(0, str(ROOT))
SHAPE = dict(B=4, H=16, N=4096)        # lesson 07's roofline shape (batch, heads, sequence)
CASES = {
    "flashlib_fa2_d64": dict(impl="fa2_forward", D=64),
    "flashlib_fa2_d128": dict(impl="fa2_forward", D=128),
    "ex07b_solution_d64": dict(impl="ex07b", D=64),
    "ex07b_solution_d128": dict(impl="ex07b", D=128),
    "flash_attention_d64": dict(impl="flash_attention", D=64),       # FA3 on Hopper
    "flash_attention_d128": dict(impl="flash_attention", D=128),
    # backward (issue 57), opt-in: before and after dQ's split, one consumer of two warpgroups
    # (wide at d64, wide_m64 at d128), and cuDNN's
    "fa3_bwd_2wg_d128": dict(impl="fa3_backward", variant="2wg", D=128),
    "fa3_bwd_2wg_split_d128": dict(impl="fa3_backward", variant="2wg_split", D=128),
    "sdpa_cudnn_bwd_d128": dict(impl="sdpa_cudnn_backward", D=128),
    "fa3_bwd_2wg_d64": dict(impl="fa3_backward", variant="2wg", D=64),
    "sdpa_cudnn_bwd_d64": dict(impl="sdpa_cudnn_backward", D=64),
    "fa3_bwd_wide_d64": dict(impl="fa3_backward", variant="wide", D=64),
    "fa3_bwd_wide_m64_d128": dict(impl="fa3_backward", variant="wide_m64", D=128),
}
BACKWARD = ("fa3_backward", "sdpa_cudnn_backward")     # impls whose case times a backward
FORWARD_CASES = [name for name, case in CASES.items() if case["impl"] not in BACKWARD]   # the lessons'
EX07B_CONFIG = dict(block_m=128, block_n=64, num_warps=4, num_stages=3)   # lesson 07, section 4b
# dense float16 tensor-core peaks and HBM bandwidths, SXM parts (NVIDIA datasheets; not measured)
DATASHEET = {"h100": dict(fp16_flops=989e12, bandwidth=3.35e12),
             "h200": dict(fp16_flops=989e12, bandwidth=4.8e12)}
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "ComputeWorkloadAnalysis")
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "math_pipe_throttle", "mio_throttle", "wait",
                 "barrier", "not_selected", "selected", "dispatch_stall", "lg_throttle", "no_instruction",
                 "branch_resolving", "membar", "sleeping", "tex_throttle", "drain", "imc_miss", "misc")
NCU_METRICS = (
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",                  # achieved occupancy
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",   # Hopper: HGMMA too
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",         # exp2 and friends (MUFU)
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    *(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS),
)
NCU_MARK = "PROFILE-KERNELS-CHILD "


# ---------------------------------------------------------------------------------------------
# the parts that need no GPU: arguments, counts, the report's files

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path, help="folder for report.json and report.md "
                        "(benchmarks/results/<gpu>/profile to commit it)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=FORWARD_CASES,
                        help="cases to run (default: the forward ones, which lessons 05 and 07 read; "
                        "the backward ones by name); the others are kept from OUTDIR's report")
    parser.add_argument("--no-ncu", action="store_true", help="skip Nsight Compute")
    parser.add_argument("--ncu-child", choices=list(CASES), help=argparse.SUPPRESS)   # run under ncu
    return parser.parse_args(argv)


def case_shape(name):
    """(B, H, N, D) of a case."""
    return SHAPE["B"], SHAPE["H"], SHAPE["N"], CASES[name]["D"]


def counts(name):
    """Lesson 07's counts for a case: matmul flops 4 B H N^2 D, HBM bytes (Q, K, V read and O
    written once in float16, lse in float32), and exps (one per score).

    A backward case: flops 2.5x, 10 B H N^2 D (S = Q K^T, dP = dO V^T, dV = P^T dO, dK = dS^T Q,
    dQ = dS K); HBM bytes a lower bound both implementations share: Q, K, V, O, dO read and dQ, dK,
    dV written once in float16, lse read and delta = rowsum(dO * O) written and read once in
    float32 (flashlib's float32 dQ accumulator, zeroed, reduce-added and read back, and cuDNN's
    scratch are left out); exps one per score (P recomputed)."""
    B, H, N, D = case_shape(name)
    if CASES[name]["impl"] in BACKWARD:
        return dict(flops=10 * B * H * N * N * D, hbm_bytes=8 * B * H * N * D * 2 + 3 * B * H * N * 4,
                    exps=B * H * N * N)
    return dict(flops=4 * B * H * N * N * D, hbm_bytes=4 * B * H * N * D * 2 + B * H * N * 4,
                exps=B * H * N * N)


def describe(name):
    """What a case measures: the first line of its section in report.md."""
    case = CASES[name]
    return {
        "fa2_forward": "Forward: flashlib's fa2_forward (autotuned).",
        "ex07b": f"Forward: exercise 07b's solution kernel, {EX07B_CONFIG}.",
        "flash_attention": "Forward: flashlib's flash_attention (FA3 on Hopper).",
        "fa3_backward": f"Backward alone: flashlib's fa3_backward, variant {case.get('variant')}, out and lse "
                        "from fa3_forward and dout made before; the timed call runs the preprocess, main and "
                        "dQ-convert kernels and the dQ accumulator's zero fill. FLOPs 2.5x the forward's.",
        "sdpa_cudnn_backward": "Backward: SDPA cuDNN's, through autograd; its time is forward + backward less "
                               "the forward alone (grad enabled), while torch.profiler and ncu see both. "
                               "FLOPs 2.5x the forward's.",
    }[case["impl"]]


def roofline(flops, hbm_bytes, ms, peak_flops, bandwidth):
    """Lesson 07's model: compute and memory times, the larger as the bound, and the fraction of
    the measured time the model accounts for."""
    compute_ms, memory_ms = flops / peak_flops * 1e3, hbm_bytes / bandwidth * 1e3
    model_ms = max(compute_ms, memory_ms)
    return dict(compute_ms=compute_ms, memory_ms=memory_ms, model_ms=model_ms,
                bound="compute" if compute_ms > memory_ms else "memory",
                fraction=model_ms / ms if ms else None)


def parse_ncu_csv(text):
    """``ncu --csv --page details`` output -> [{kernel, sections: {section: {metric: {value,
    unit}}}}], one per profiled launch. Numbers with thousands separators become floats; other
    values stay strings."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    launches = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        launch = launches.setdefault(row.get("ID"), dict(kernel=row.get("Kernel Name"), sections={}))
        value = row.get("Metric Value", "")
        try:
            value = float(value.replace(",", ""))
        except ValueError:
            pass
        launch["sections"].setdefault(row.get("Section Name"), {})[row.get("Metric Name")] = \
            dict(value=value, unit=row.get("Metric Unit", ""))
    return list(launches.values())


def ncu_summary(launch):
    """The few numbers report.md shows from one ncu launch (None where ncu gave none)."""
    flat, units = {}, {}
    for metrics in launch["sections"].values():
        flat.update({name: m["value"] for name, m in metrics.items()})
        units.update({name: m["unit"] for name, m in metrics.items()})
    pick = lambda *names: next((flat[n] for n in names if n in flat), None)  # noqa: E731
    duration = pick("Duration")
    if isinstance(duration, float):      # ncu picks the unit by the size: make it microseconds
        duration *= {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}.get(
            units.get("Duration"), 1.0)
    stalls = {r: flat[f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"]
              for r in STALL_REASONS if f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" in flat}
    return dict(
        duration_us=duration, sm_throughput_pct=pick("Compute (SM) Throughput", "SM Throughput"),
        dram_throughput_pct=pick("DRAM Throughput", "Memory Throughput"),
        registers=pick("Registers Per Thread"), theoretical_occupancy_pct=pick("Theoretical Occupancy"),
        achieved_occupancy_pct=pick("Achieved Occupancy"),
        waves_per_sm=pick("Waves Per SM"), shared_config=pick("Shared Memory Configuration Size"),
        static_shared=pick("Static Shared Memory Per Block"), dynamic_shared=pick("Dynamic Shared Memory Per Block"),
        block_limit_registers=pick("Block Limit Registers"), block_limit_shared=pick("Block Limit Shared Mem"),
        block_limit_warps=pick("Block Limit Warps"), block_limit_sm=pick("Block Limit SM"),
        tensor_pipe_pct=pick("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                             "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
        xu_pipe_pct=pick("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"),
        fma_pipe_pct=pick("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
        stalls=dict(sorted(stalls.items(), key=lambda kv: -(kv[1] if isinstance(kv[1], float) else 0))))


def longest_launch(launches):
    """The launch of ``parse_ncu_csv``'s list that ran longest (ncu_summary's duration: ncu gives
    each in a unit of its size), the one the report summarises: a backward's main kernel."""
    def duration(launch):
        us = ncu_summary(launch)["duration_us"]
        return us if isinstance(us, float) else 0.0
    return max(launches, key=duration)


def merge(old, new):
    """``new``'s report with the cases it lacks taken from ``old`` (a run of some cases only)."""
    if not old:
        return new
    merged = dict(new)
    merged["cases"] = {**old.get("cases", {}), **new.get("cases", {})}
    return merged


def _fmt(x, spec, missing="-"):
    return missing if x is None or isinstance(x, str) else format(x, spec)


def markdown(report):
    """report.md: the report's numbers as tables, for a reader without the lessons."""
    env, peaks = report["env"], report["peaks"]
    tera = {k: (peaks[k] / 1e12 if peaks.get(k) else None)
            for k in ("measured_fp16_flops", "datasheet_fp16_flops", "measured_bandwidth")}
    out = [f"# Kernel profile: {env['gpu']}", "",
           f"torch {env['torch']}, Triton {env['triton']}, CUDA {env.get('cuda')}, {env['date']}; "
           f"autotune {env.get('autotune')}; written by `tools/profile_kernels.py`.", "",
           f"Peak float16 matmul measured here: {_fmt(tera['measured_fp16_flops'], '.0f')} TFLOP/s "
           f"(datasheet {_fmt(tera['datasheet_fp16_flops'], '.0f')}); "
           f"copy bandwidth {_fmt(tera['measured_bandwidth'], '.2f')} TB/s.", ""]
    for name, case in report["cases"].items():
        what = case.get("measured") or (describe(name) if name in CASES else "")   # older reports lack it
        ms = _fmt(case.get("ms"), ".3f") + " ms"
        if case.get("forward_ms") is not None:
            ms += (f" (forward + backward {_fmt(case.get('forward_backward_ms'), '.3f')} ms less forward "
                   f"{_fmt(case['forward_ms'], '.3f')} ms)")
        out += [f"## {name}", ""] + ([what, ""] if what else [])
        out += [f"B={case['B']} H={case['H']} N={case['N']} d={case['D']} {case['dtype']}, "
                f"not causal: {ms}, {_fmt(case.get('tflops'), '.0f')} TFLOP/s = "
                f"{_fmt(case.get('fraction_of_measured_peak'), '.0%')} of the measured peak, "
                f"{_fmt(case.get('fraction_of_datasheet_peak'), '.0%')} of the datasheet's; lesson 07's roofline "
                f"model {_fmt((case.get('roofline') or {}).get('model_ms'), '.3f')} ms "
                f"({_fmt((case.get('roofline') or {}).get('fraction'), '.0%')} of the measured time)."]
        if case.get("kernels"):          # none for cuDNN's (no Triton launch to read)
            out += ["", "| kernel | config | regs | spills | stack B | STL/LDL | shared KB | "
                    "blocks/SM (calc, driver) | occupancy | limited by | programs | waves |", "|" + " --- |" * 12]
        for k in case.get("kernels", []):
            r, c, o = k["resources"], k.get("cubin") or {}, k["occupancy"]
            out.append(f"| {k['kernel']} | {k['config']} | {r['registers']} | {r['spills']} | {c.get('stack', '-')} | "
                       f"{c.get('local_stores', '-')}/{c.get('local_loads', '-')} | {r['shared'] / 1024:.1f} | "
                       f"{o['blocks_per_sm']}, {k.get('driver_blocks_per_sm')} | {o['occupancy']:.0%} | "
                       f"{', '.join(k.get('limited_by', []))} | {k.get('programs')} | {k.get('waves')} |")
        if case.get("profiler"):
            out += ["", "torch.profiler (5 calls):", "", "| kernel | calls | GPU ms | share |", "| --- | --- | --- | --- |"]
            out += [f"| {r['name'][:70]} | {r['calls']} | {r['total_us'] / 1e3:.3f} | {r['share']:.0%} |"
                    for r in case["profiler"]]
        ncu = case.get("ncu")
        if isinstance(ncu, dict) and ncu.get("summary"):
            s = ncu["summary"]
            ran = "; ".join(f"{c['kernel']} {c['config']}" for c in ncu.get("config_used") or [])
            n = len(ncu.get("launches") or [])
            if n > 1 and ncu.get("kernel"):      # a backward's kernels; cuDNN's forward and backward
                which = f"the longest of the {n} launches of one call, {ncu['kernel']}" + (
                    f"; Triton configs: {ran}" if ran else "")
            else:
                which = f"one launch of {ran or 'the case'}"
            out += ["", f"Nsight Compute ({which}): " + ", ".join(
                f"{k} {_fmt(v, '.6g', v)}" for k, v in s.items() if k != "stalls" and v is not None)]
            if s.get("stalls"):
                out.append("warp stalls per issued instruction: " + ", ".join(
                    f"{k} {_fmt(v, '.2f')}" for k, v in list(s["stalls"].items())[:6]))
        elif ncu is not None:
            out += ["", f"Nsight Compute: {ncu if isinstance(ncu, str) else ncu.get('error', ncu)}"]
        if case.get("errors"):
            out += ["", "errors: " + "; ".join(e.splitlines()[-1] for e in case["errors"])]
        out.append("")
    return "\n".join(out)


def write_report(report, outdir):
    """Write report.json (merged with a report already there) and report.md; returns their paths."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "report.json"
    old = json.loads(path.read_text()) if path.is_file() else None
    report = merge(old, report)
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    md = outdir / "report.md"
    md.write_text(markdown(report))
    return path, md


def find_ncu():
    """The ncu executable: on PATH, else in the usual install folders; None if absent."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


# ---------------------------------------------------------------------------------------------
# the GPU parts

def _attention(name):
    """A case's inputs and calls: q, k, v, dout (None for a forward case), fn, forward. fn() runs
    what is timed and profiled: the forward (returns out), or the backward for the fixed dout
    (returns dq, dk, dv). forward: None, or for cuDNN, whose backward autograd reaches only through
    its forward (fn runs both), that forward alone, to take its time off."""
    import torch

    from flashlib import course
    from flashlib.bench.harness import sdpa
    from flashlib.kernels import fa3_bwd
    from flashlib.kernels.fa2_fwd import fa2_forward
    from flashlib.kernels.fa3_fwd import fa3_forward
    from flashlib.ops import flash_attention
    impl = CASES[name]["impl"]
    B, H, N, D = case_shape(name)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
    run = types.SimpleNamespace(q=q, k=k, v=v, dout=torch.randn_like(q) if impl in BACKWARD else None,
                                forward=None)
    if impl == "fa2_forward":
        run.fn = lambda: fa2_forward(q, k, v)[0]
    elif impl == "flash_attention":
        run.fn = lambda: flash_attention(q, k, v)
    elif impl == "ex07b":
        solution = course.load_module(ROOT / "solutions" / "ex07b_fa2_kernel.py")
        run.fn = lambda: solution.attention_forward(q, k, v, **EX07B_CONFIG)[0]
    elif impl == "fa3_backward":
        out, lse = fa3_forward(q, k, v)
        run.fn = lambda: fa3_bwd.fa3_backward(q, k, v, out, lse, run.dout, causal=False,
                                              variant=CASES[name]["variant"])
    else:                                              # sdpa_cudnn_backward
        cudnn, leaves = sdpa("sdpa_cudnn"), [t.requires_grad_() for t in (q, k, v)]
        run.fn = lambda: torch.autograd.grad(cudnn(*leaves, False), leaves, run.dout)
        run.forward = lambda: cudnn(*leaves, False)
    return run


def _max_error(run):
    """The largest |difference| of a case's result (out, or dq, dk and dv) on batch 0, heads 0-1
    from float64 attention (``attention_ref``; the gradients by autograd through it)."""
    import torch

    from flashlib.reference import attention_ref
    backward = run.dout is not None
    leaves = [t[:1, :2].detach().double().requires_grad_(backward) for t in (run.q, run.k, run.v)]
    want = attention_ref(*leaves)[0]
    want = torch.autograd.grad(want, leaves, run.dout[:1, :2].double()) if backward else [want]
    got = run.fn() if backward else [run.fn()]
    return max(float((g[:1, :2].double() - w).abs().max()) for g, w in zip(got, want))


def measure_peaks(gpu):
    """A float16 8192^3 matmul's FLOP/s and a 1 GiB copy's bytes/s (read + write), as lesson 07."""
    import torch
    import triton.testing
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    flops = 2 * 8192 ** 3 / (triton.testing.do_bench(lambda: a @ a) * 1e-3)
    buf = torch.empty(2 ** 28, device="cuda", dtype=torch.float16)
    bandwidth = 2 * buf.numel() * 2 / (triton.testing.do_bench(lambda: buf.clone()) * 1e-3)
    sheet = DATASHEET.get(gpu, {})
    return dict(measured_fp16_flops=flops, measured_bandwidth=bandwidth,
                datasheet_fp16_flops=sheet.get("fp16_flops"), datasheet_bandwidth=sheet.get("bandwidth"),
                how="triton.testing.do_bench (mean): a @ a, 8192^3 float16; clone of 2^28 float16")


def driver_blocks_per_sm(compiled):
    """The driver's resident blocks per SM for a loaded kernel (cuOccupancyMaxActiveBlocksPerMultiprocessor
    with its warps and dynamic shared memory), or a string saying why not."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        blocks = ctypes.c_int()
        err = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), ctypes.c_void_p(compiled.function),
            ctypes.c_int(compiled.metadata.num_warps * 32), ctypes.c_size_t(compiled.metadata.shared))
        return blocks.value if err == 0 else f"CUresult {err}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def kernel_records(launches, sms):
    from flashlib.teach import profile
    records = []
    for launch in launches:
        resources = profile.kernel_resources(launch.compiled)
        occ = resources.occupancy()
        cubin = None
        try:
            cubin = profile.cubin_resources(launch.compiled.kernel, resources.name)
        except Exception as e:
            cubin = {"error": f"{type(e).__name__}: {e}"}
        programs = math.prod(launch.grid) if launch.grid else None
        at_once = occ.blocks_per_sm * sms
        records.append(dict(kernel=launch.kernel, config=launch.config, grid=launch.grid, programs=programs,
                            calls=launch.calls, resources=resources._asdict(), cubin=cubin,
                            occupancy=occ._asdict(), limited_by=occ.limited_by,
                            driver_blocks_per_sm=driver_blocks_per_sm(launch.compiled),
                            waves=math.ceil(programs / at_once) if programs and at_once else None))
    return records


def profile_case(name, peaks, sms):
    import torch
    import triton.testing

    from flashlib.teach import profile
    B, H, N, D = case_shape(name)
    record = dict(impl=CASES[name]["impl"], variant=CASES[name].get("variant"), measured=describe(name),
                  B=B, H=H, N=N, D=D, dtype="float16", causal=False,
                  ex07b_config=EX07B_CONFIG if CASES[name]["impl"] == "ex07b" else None,
                  **counts(name), errors=[])
    try:
        run = _attention(name)
        record["max_error_vs_float64"] = _max_error(run)   # backward: over dq, dk, dv
        torch.cuda.synchronize()                       # the first call autotuned and compiled
        with profile.captured_launches() as launches:
            run.fn()
            torch.cuda.synchronize()
        record["kernels"] = kernel_records(launches, sms)
        ms = triton.testing.do_bench(run.fn, warmup=25, rep=200)
        if run.forward is not None:                    # cuDNN: its forward's time taken off
            forward_ms = triton.testing.do_bench(run.forward, warmup=25, rep=200)
            record.update(forward_backward_ms=ms, forward_ms=forward_ms)
            ms -= forward_ms
        record.update(ms=ms, tflops=record["flops"] / ms / 1e9,
                      fraction_of_measured_peak=record["flops"] / (ms * 1e-3) / peaks["measured_fp16_flops"],
                      fraction_of_datasheet_peak=(record["flops"] / (ms * 1e-3) / peaks["datasheet_fp16_flops"]
                                                  if peaks.get("datasheet_fp16_flops") else None),
                      roofline=roofline(record["flops"], record["hbm_bytes"], ms, peaks["measured_fp16_flops"],
                                        peaks["measured_bandwidth"]))
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(5):
                run.fn()
            torch.cuda.synchronize()
        record["profiler"] = profile.kernel_table(prof, top=8)
    except Exception:
        record["errors"].append(traceback.format_exc(limit=4))
    return record


def run_ncu(name, outdir, ncu):
    """One call of the case under ncu (a child process), each of its launches profiled; {summary
    (the longest launch's), kernel (its name), launches, config_used, command}."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [ncu, "--profile-from-start", "off", "--target-processes", "all", "--clock-control", "none",
            "--csv", "--page", "details", *[a for s in NCU_SECTIONS for a in ("--section", s)]]
    child = [sys.executable, str(Path(__file__).resolve()), str(outdir), "--ncu-child", name]
    wanted = _available_metrics(ncu, NCU_METRICS)
    attempts = [base + ["--metrics", ",".join(wanted)] + child, base + child] if wanted else [base + child]
    last = None
    for command in attempts:
        try:
            run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=420)
        except subprocess.TimeoutExpired:
            return dict(error="ncu timed out after 420 s", command=" ".join(command))
        launches = parse_ncu_csv(run.stdout)
        config = next((json.loads(line[len(NCU_MARK):]) for line in run.stdout.splitlines()
                       if line.startswith(NCU_MARK)), None)
        if launches:
            main_launch = longest_launch(launches)
            return dict(summary=ncu_summary(main_launch), kernel=main_launch["kernel"], launches=launches,
                        config_used=config, command=" ".join(command),
                        metrics_asked=len(wanted) if "--metrics" in command else 0)
        last = dict(error=f"ncu profiled nothing (exit {run.returncode})",
                    stderr=(run.stderr or "")[-2000:], stdout=(run.stdout or "")[-2000:], command=" ".join(command))
    return last


def _available_metrics(ncu, wanted):
    """The metrics of ``wanted`` that this GPU's ncu knows (``--query-metrics``); all of them if
    the query fails (a wrong name then fails the first attempt, and run_ncu retries without)."""
    try:
        run = subprocess.run([ncu, "--query-metrics", "--csv"], capture_output=True, text=True, timeout=120)
        known = {line.split(",")[0].strip('"') for line in run.stdout.splitlines()}
        if len(known) > 50:
            return [m for m in wanted if m.split(".")[0] in known]
    except Exception:
        pass
    return list(wanted)


def ncu_child(name):
    """Under ncu: warm the case up (autotuning comes from the disk cache), then one call (all its
    launches: a backward's several kernels, cuDNN's forward and backward) between
    cudaProfilerStart and Stop; prints the configs of the Triton kernels it ran."""
    import torch

    from flashlib.teach import profile
    run = _attention(name)
    run.fn()
    torch.cuda.synchronize()
    with profile.captured_launches() as launches:
        torch.cuda.profiler.start()
        run.fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(NCU_MARK + json.dumps([dict(kernel=launch.kernel, config=launch.config) for launch in launches]))


def environment():
    import torch
    import triton

    from flashlib import runtime
    props = torch.cuda.get_device_properties(0)
    clock = None
    if shutil.which("nvidia-smi"):
        run = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True)
        clock = run.stdout.strip().splitlines()[0] if run.returncode == 0 and run.stdout.strip() else None
    return dict(gpu=props.name, gpu_short=runtime.gpu_name(), capability=f"{props.major}.{props.minor}",
                sm_count=props.multi_processor_count, torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, autotune=runtime.autotuning(runtime.OPTIONS), max_sm_clock_mhz=clock,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def main(argv=None):
    args = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("profile_kernels.py needs a CUDA GPU (it times and profiles kernels); the "
                         "lessons read its committed report on a CPU")
    if args.ncu_child:
        return ncu_child(args.ncu_child)
    env = environment()
    peaks = measure_peaks(env["gpu_short"])
    ncu = None if args.no_ncu else find_ncu()
    report = dict(env=env, peaks=peaks, cases={})
    for name in args.cases:
        print(f"{name}: timing and torch.profiler ...", flush=True)
        record = profile_case(name, peaks, env["sm_count"])
        if args.no_ncu:
            record["ncu"] = "ncu skipped (--no-ncu)"
        elif ncu is None:
            record["ncu"] = "ncu not available"
        else:
            print(f"{name}: ncu ...", flush=True)
            try:
                record["ncu"] = run_ncu(name, args.outdir, ncu)
            except Exception:
                record["ncu"] = dict(error=traceback.format_exc(limit=3))
        report["cases"][name] = record
        write_report(report, args.outdir)            # after each case: a partial run still leaves a report
    json_path, md_path = write_report(report, args.outdir)
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
