"""Grader of exercise 07c (lesson 07): kernel_summary(events, name_filter, category),
idle_gaps(events, category) and launch_latency(events), read off a torch.profiler trace's
"traceEvents" list.

The references are flashlib.teach.trace's, computed from copies of the events; the learner's
functions get another copy, checked unchanged after each call. Synthetic traces are built here,
with timestamps in multiples of 1/8 us (exact in floating point) drawn from the seed, in the
shape Kineto writes them (metadata, flow arrows, host operators and annotations, CUDA runtime and
driver launches, kernels on several streams and devices, memcpys, kernels launched before the
window), and shuffled: nested operators, overlapping kernels on two streams, zero-length kernels,
back-to-back kernels, two devices, an empty trace. Then a real trace recorded here with
torch.profiler (CPU; CUDA too when there is a GPU). A failure is diagnosed by recomputing the
answer under each common mistake (file order instead of time order, the previous event's end
instead of the latest end, per stream, devices merged, milliseconds, equality instead of
substring, every category, zero-length events dropped, launches paired by order or by External
id, the end of the launch call, cuda_driver launches missed) and naming the one that matches.
"""
import copy
import json
import math
import os
import tempfile

import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.teach import trace

pytestmark = pytest.mark.ex07c
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own trace readers: a call from the learner's file is "not accepted"
FLASHLIB_ANSWERS = ("flashlib.teach.trace.kernel_summary", "flashlib.teach.trace.idle_gaps",
                    "flashlib.teach.trace.launch_latency")

TOL = 1e-6            # us; synthetic times are exact, real ones are read from the same floats
TRITON_KERNELS = ("_fa2_fwd_kernel", "fa2_kernel", "_attn_fwd_inner")
TORCH_KERNELS = ("void at::native::vectorized_elementwise_kernel<4, ...>", "ampere_sgemm_64x32_nn")

HINT_CATEGORY = ("count only the events of the given category (e['cat'] == category): a trace "
                 "names the same work on the host (cpu_op, user_annotation, the launch call) and "
                 "on the GPU (kernel, gpu_user_annotation)")
HINT_SUBSTRING = ("name_filter is a substring: keep the events whose name contains it "
                  "(name_filter in e['name']; \"\" keeps every name), not only those named exactly so")
HINT_UNITS = "ts and dur are microseconds already: return them as they are (not divided by 1000)"
HINT_ZERO_LAUNCH = ("a zero-length event (dur 0: too short to measure) is still a launch: count it, "
                    "and it still ends a gap")
HINT_MEAN = "mean_us is the mean of that name's events: its total over its own launch count"
HINT_SORT = ("the trace's events are in no particular order: sort each device's events by their "
             "start (ts) before walking them (a sorted copy: the events are not yours to reorder)")
HINT_RUNNING_END = ("an event that starts before an earlier one ends overlaps it: keep the latest "
                    "end so far (a long kernel, or an operator around its children, covers the "
                    "short ones inside it); a gap begins only when every earlier event has ended")
HINT_STREAMS = ("a device is idle only while none of its streams runs a kernel: merge all events of "
                "one pid (every tid) into one timeline, not a timeline per stream")
HINT_DEVICES = "each device (pid) has its own timeline: one device's kernels do not fill another's gaps"
HINT_ZERO_GAP = ("back-to-back events (one starts where the last ended) leave no gap: keep only "
                 "gaps with start < end")
HINT_GAP_ENDS = ("a gap runs from the end of the work before it (ts + dur, the latest end so far) to "
                 "the start of the next event")
HINT_BOUNDS = ("gaps lie between the start of the device's first event of the category and the end "
               "of its last: none before the first, none after the last, and none left out")
HINT_CHANGED = "leave the events as they were: sort a copy (sorted(...)), never events.sort() or a changed dict"
HINT_DRIVER = ("a launch call is a cuda_runtime event (cudaLaunchKernel) or a cuda_driver event "
               "(cuLaunchKernel, cuLaunchKernelEx: how Triton launches): look in both categories")
HINT_LAUNCH_START = ("the latency runs from the start of the launch call (its ts) to the kernel's ts, "
                     "not from the end of the call (the kernel may start before the call returns)")
HINT_SIGN = "the latency is the kernel's start minus its launch call's start (positive: the kernel starts later)"
HINT_CORRELATION = ("link a kernel to its launch call by args['correlation'] (the same id on both), "
                    "not by order (streams reorder kernels, and some launch calls start memcpys or "
                    "none) nor by 'External id' (the operator's id, shared by all its launches)")
HINT_NOT_KERNEL = ("only kernels: a gpu_memcpy (or memset) has a correlation too, but it is not a "
                   "kernel (cat 'kernel')")


def _q(x):
    """x rounded to 1/8 us: exact in floating point, so sums and differences are too."""
    return round(float(x) * 8) / 8


# ---------------------------------------------------------------------------------------------
# synthetic traces in Kineto's shape

def _meta(pid, tid, name):
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0.0, "args": {"name": name}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0.0, "args": {"name": name}}]


def _x(cat, name, pid, tid, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": float(ts),
            "dur": float(dur), "args": args}


def _gpu_trace(rng, n, *, devices=(0,), n_streams=2, zero=True):
    """A host thread launching ``n`` steps of kernels (and some memcpys) onto ``n_streams`` streams
    of each of ``devices``; shuffled. Each kernel starts after its launch call and after the
    previous work on its stream."""
    host = int(rng.integers(1000, 60000))
    base = _q(rng.integers(10**6, 10**9))
    streams = {d: [int(s) for s in rng.choice(np.arange(7, 40), n_streams, replace=False)] for d in devices}
    events = _meta(host, host, "python")
    for d in devices:
        events += _meta(d, streams[d][0], f"GPU {d}")
    free = {(d, s): 0.0 for d in devices for s in streams[d]}
    t, corr, ext = base, int(rng.integers(1, 10**5)), int(rng.integers(1, 10**4))
    for i in range(n):
        d = devices[int(rng.integers(len(devices)))]
        s = streams[d][int(rng.integers(len(streams[d])))]
        ext += 1
        op_dur = _q(rng.uniform(20, 40))                   # long enough for two launch calls
        events.append(_x("cpu_op", "aten::fa2_forward" if i % 2 else "aten::mm", host, host, t, op_dur,
                         **{"External id": ext}))
        events.append(_x("user_annotation", "fa2_forward_step", host, host, t - 1, op_dur + 2))
        host_t = t
        for _ in range(1 + int(rng.random() < 0.3)):       # an operator may launch two kernels
            corr += int(rng.integers(1, 4))
            launch_ts = host_t + _q(rng.uniform(1, 3))
            launch_dur = _q(rng.uniform(2, 6))
            triton = rng.random() < 0.6
            name = (TRITON_KERNELS if triton else TORCH_KERNELS)[int(rng.integers(3 if triton else 2))]
            cat, call = (("cuda_driver", "cuLaunchKernelEx") if triton else ("cuda_runtime", "cudaLaunchKernel"))
            events.append(_x(cat, call, host, host, launch_ts, launch_dur, cbid=211, correlation=corr,
                             **{"External id": ext}))
            host_t = launch_ts + launch_dur
            start = max(launch_ts + _q(rng.uniform(2, 9)), free[d, s] + _q(rng.choice([0, 0, 1, 5, 40])))
            dur = 0.0 if zero and rng.random() < 0.15 else _q(rng.uniform(1, 50))
            free[d, s] = start + dur
            events.append(_x("kernel", name, d, s, start, dur, device=d, stream=s, correlation=corr,
                             grid=[4, 1, 1], block=[128, 1, 1], **{"External id": ext}))
            events.append({"ph": "s", "id": corr, "pid": host, "tid": host, "ts": launch_ts, "cat": "ac2g",
                           "name": "ac2g"})
            events.append({"ph": "f", "id": corr, "pid": d, "tid": s, "ts": start, "cat": "ac2g",
                           "name": "ac2g", "bp": "e"})
            events.append(_x("gpu_user_annotation", "fa2_forward_step", d, s, start - 0.125, dur + 0.25))
        if rng.random() < 0.25:                            # a copy: correlated, but not a kernel
            corr += 1
            copy_ts = t + op_dur + _q(rng.uniform(1, 3))
            events.append(_x("cuda_runtime", "cudaMemcpyAsync", host, host, copy_ts, 4, cbid=41, correlation=corr))
            start = max(copy_ts + 2, free[d, s])
            free[d, s] = start + 3
            events.append(_x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", d, s, start, 3, device=d,
                             stream=s, correlation=corr, bytes=4096))
        t += op_dur + _q(rng.uniform(2, 60))
    # a kernel launched before the profiler started: no launch call in the trace
    d = devices[0]
    events.append(_x("kernel", TORCH_KERNELS[0], d, streams[d][0], base - 30, 5, device=d,
                     stream=streams[d][0], correlation=corr + 100))
    events.append({"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
                   "tid": "Trace PyTorch Profiler", "ts": base - 50})
    events.append(_x("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", base - 50, t - base + 100))
    order = rng.permutation(len(events))
    return [events[i] for i in order]


def _shifted(rng, events):
    """``events`` moved to a random origin (whole microseconds) and shuffled."""
    base = _q(rng.integers(10**5, 10**9))
    moved = []
    for e in events:
        e = dict(e)
        if "ts" in e:
            e["ts"] = e["ts"] + base
        moved.append(e)
    return [moved[i] for i in rng.permutation(len(moved))]


def _nested_ops(rng):
    """Host operators, nested (an operator around its children), back to back, one of zero length."""
    pid = tid = int(rng.integers(1000, 60000))
    s = _q(rng.uniform(1, 3))                              # a time scale
    events = _meta(pid, tid, "python") + [
        _x("cpu_op", "aten::linear", pid, tid, 0, 100 * s),
        _x("cpu_op", "aten::t", pid, tid, 10 * s, 10 * s),
        _x("cpu_op", "aten::addmm", pid, tid, 30 * s, 10 * s),
        _x("cpu_op", "aten::softmax", pid, tid, 150 * s, 10 * s),
        _x("cpu_op", "aten::_softmax", pid, tid, 152 * s, 5 * s),
        _x("cpu_op", "aten::empty", pid, tid, 160 * s, 10 * s),      # back to back
        _x("cpu_op", "aten::empty", pid, tid, 200 * s, 0),           # zero length: splits the gap
        _x("cpu_op", "aten::copy_", pid, tid, 230 * s, 8 * s),
        _x("user_annotation", "step", pid, tid, -5 * s, 260 * s),    # another category
    ]
    return _shifted(rng, events), "cpu_op"


def _two_streams(rng):
    """Device 0: overlapping kernels on streams 7 and 13; device 1: its own kernels inside device 0's
    busy time."""
    a, b = (int(x) for x in rng.choice(np.arange(7, 40), 2, replace=False))
    s = _q(rng.uniform(1, 3))
    k = "kernel"
    events = _meta(0, a, "GPU 0") + _meta(1, a, "GPU 1") + [
        _x(k, "fa2_kernel", 0, a, 0, 50 * s), _x(k, "fa2_kernel", 0, a, 80 * s, 20 * s),
        _x(k, "_fa2_fwd_kernel", 0, b, 40 * s, 50 * s), _x(k, "_fa2_fwd_kernel", 0, b, 120 * s, 10 * s),
        _x(k, "fa2_kernel", 1, a, 10 * s, 20 * s), _x(k, "fa2_kernel", 1, a, 60 * s, 10 * s),
        _x(k, "fa2_kernel", 1, b, 64 * s, 2 * s),
    ]
    return _shifted(rng, events), "kernel"


def _launches(rng):
    """Launch calls and their kernels: runtime and driver launches, one operator launching two
    kernels (one External id), a kernel on a second stream starting before an earlier launch's
    kernel, a memcpy, a sync, a kernel launched before the window."""
    host, a, b = 4242, 7, 13
    c = int(rng.integers(1, 10**5))
    s = _q(rng.uniform(1, 3))
    events = _meta(host, host, "python") + [
        _x("cpu_op", "aten::mm", host, host, 0, 12 * s, **{"External id": 5}),
        _x("cuda_runtime", "cudaLaunchKernel", host, host, 1 * s, 5 * s, cbid=211, correlation=c,
           **{"External id": 5}),
        _x("kernel", TORCH_KERNELS[1], 0, a, 9 * s, 50 * s, correlation=c, stream=a, **{"External id": 5}),
        _x("cpu_op", "fa2_forward", host, host, 20 * s, 30 * s, **{"External id": 6}),
        _x("cuda_driver", "cuLaunchKernelEx", host, host, 21 * s, 6 * s, cbid=307, correlation=c + 1,
           **{"External id": 6}),
        _x("kernel", TRITON_KERNELS[0], 0, a, 59 * s, 20 * s, correlation=c + 1, stream=a, **{"External id": 6}),
        _x("cuda_driver", "cuLaunchKernelEx", host, host, 30 * s, 4 * s, cbid=307, correlation=c + 2,
           **{"External id": 6}),
        _x("kernel", TRITON_KERNELS[1], 0, b, 32 * s, 3 * s, correlation=c + 2, stream=b, **{"External id": 6}),
        _x("cuda_runtime", "cudaMemcpyAsync", host, host, 60 * s, 5 * s, cbid=41, correlation=c + 3),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 0, a, 80 * s, 2 * s, correlation=c + 3, stream=a),
        _x("cuda_runtime", "cudaDeviceSynchronize", host, host, 66 * s, 20 * s, cbid=165, correlation=c + 4),
        _x("kernel", TORCH_KERNELS[0], 0, b, -40 * s, 2 * s, correlation=c - 7, stream=b),
    ]
    return _shifted(rng, events)


# ---------------------------------------------------------------------------------------------
# calling the learner's functions

def _call(impl, name, events, *args):
    """The learner's ``name`` on a copy of ``events``, checked to leave it unchanged."""
    mine = copy.deepcopy(events)
    got = checks.function(impl, name)(mine, *args)
    if mine != events:
        checks.fail(f"{name} changed the events it was given (their order or their contents)", HINT_CHANGED)
    return got


def _number(x, what):
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        checks.fail(f"{what} is {x!r}; expected a number")
    value = float(x)
    if not math.isfinite(value):
        checks.fail(f"{what} is {value}; expected a finite number of microseconds")
    return value


def _summary(impl, events, name_filter, category):
    what = f"kernel_summary(events, {name_filter!r}, {category!r})"
    got = _call(impl, "kernel_summary", events, name_filter, category)
    if not isinstance(got, dict):
        checks.fail(f"{what} returned {type(got).__name__}; return a dict {{name: (launches, total_us, mean_us)}}")
    rows = {}
    for name, row in got.items():
        if not isinstance(row, (tuple, list)) or len(row) != 3:
            checks.fail(f"{what}[{name!r}] is {row!r}; expected a tuple (launches, total_us, mean_us)")
        rows[name] = tuple(_number(v, f"{what}[{name!r}]") for v in row)
    return what, rows


def _gaps(impl, events, category):
    what = f"idle_gaps(events, {category!r})"
    got = _call(impl, "idle_gaps", events, category)
    if not isinstance(got, dict):
        checks.fail(f"{what} returned {type(got).__name__}; return a dict {{pid: [(start, end), ...]}}")
    out = {}
    for pid, gaps in got.items():
        if not isinstance(gaps, (list, tuple)):
            checks.fail(f"{what}[{pid!r}] is {type(gaps).__name__}; expected a list of (start, end) pairs")
        pairs = []
        for gap in gaps:
            if not isinstance(gap, (tuple, list)) or len(gap) != 2:
                checks.fail(f"{what}[{pid!r}] holds {gap!r}; each gap is a pair (start, end)")
            pairs.append(tuple(_number(v, f"a gap of {what}[{pid!r}]") for v in gap))
        if pairs:
            out[pid] = pairs
    return what, out


def _latency(impl, events):
    what = "launch_latency(events)"
    got = _call(impl, "launch_latency", events)
    if not isinstance(got, dict):
        checks.fail(f"{what} returned {type(got).__name__}; return a dict {{correlation: us}}")
    return what, {corr: _number(v, f"{what}[{corr!r}]") for corr, v in got.items()}


# ---------------------------------------------------------------------------------------------
# the references, and the answers of common mistakes

def _ref_summary(events, name_filter, category):
    return trace.kernel_summary(copy.deepcopy(events), name_filter, category)


def _ref_gaps(events, category):
    return {pid: gaps for pid, gaps in trace.idle_gaps(copy.deepcopy(events), category).items() if gaps}


def _close(a, b):
    return abs(a - b) <= TOL * max(1.0, abs(b) * 1e-12)


def _same_rows(got, want):
    return got.keys() == want.keys() and all(
        got[k][0] == want[k][0] and all(_close(x, y) for x, y in zip(got[k][1:], want[k][1:])) for k in want)


def _same_gaps(got, want):
    return got.keys() == want.keys() and all(
        len(got[p]) == len(want[p]) and all(_close(x, y) for g, w in zip(got[p], want[p]) for x, y in zip(g, w))
        for p in want)


def _relabelled(events, key):
    """The events with each "pid" replaced by key(event)."""
    return [dict(e, pid=key(e)) if "pid" in e else e for e in events]


def _ranges(events, category):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == category]


def _gaps_in_file_order(events, category, running=True):
    """idle_gaps without sorting (running: keep the latest end), or sorted but with the
    previous event's end (running=False, sort=True)."""
    out = {}
    for pid in {e["pid"] for e in _ranges(events, category)}:
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in _ranges(events, category) if e["pid"] == pid]
        if not running:
            spans.sort()
        found, until = [], spans[0][1]
        for start, end in spans[1:]:
            if start > until:
                found.append((until, start))
            until = max(until, end) if running else end
        if found:
            out[pid] = found
    return out


def _summary_hint(events, name_filter, category, got, want):
    if got.keys() - want.keys():
        extra = sorted(got.keys() - want.keys())[0]
        return HINT_SUBSTRING if name_filter not in extra else HINT_CATEGORY
    if want.keys() - got.keys():
        missing = sorted(want.keys() - got.keys())[0]
        if all(e["dur"] == 0 for e in _ranges(events, category) if e["name"] == missing):
            return HINT_ZERO_LAUNCH
        return HINT_SUBSTRING if missing != name_filter else None
    for name in want:
        g, w = got[name], want[name]
        if g[0] != w[0]:
            zero = sum(1 for e in _ranges(events, category) if e["name"] == name and e["dur"] == 0)
            every = sum(1 for e in events if e.get("name") == name and e.get("dur") is not None)
            if g[0] == w[0] - zero and zero:
                return HINT_ZERO_LAUNCH
            if g[0] == every:
                return HINT_CATEGORY
            return None
        if w[1] and _close(g[1] * 1000, w[1]):
            return HINT_UNITS
        if _close(g[1], w[1]) and not _close(g[2], w[2]):
            return HINT_MEAN
    return None


def _gaps_hint(impl, events, category, got, want):
    if any(start >= end for gaps in got.values() for start, end in gaps):
        if all(start <= end for gaps in got.values() for start, end in gaps):
            return HINT_ZERO_GAP
        return HINT_SORT
    scaled = {p: [(a * 1000, b * 1000) for a, b in g] for p, g in got.items()}
    if _same_gaps(scaled, want):
        return HINT_UNITS
    merged = _ref_gaps(_relabelled(events, lambda e: 0), category).get(0, [])
    if any(_same_gaps({0: g}, {0: merged}) and not _same_gaps({0: want.get(p, [])}, {0: merged})
           for p, g in got.items()):
        return HINT_DEVICES                         # every device's kernels on one timeline
    per_stream = _ref_gaps(_relabelled(events, lambda e: (e["pid"], e.get("tid"))), category)
    merged = {}
    for (pid, _), gaps in per_stream.items():
        merged.setdefault(pid, []).extend(gaps)
    if _same_gaps({p: sorted(g) for p, g in got.items()}, {p: sorted(g) for p, g in merged.items()}):
        return HINT_STREAMS
    if _same_gaps(got, _gaps_in_file_order(events, category, running=False)):
        return HINT_RUNNING_END
    if _same_gaps(got, _ref_gaps([e for e in events if e.get("dur") != 0], category)):
        return HINT_ZERO_LAUNCH
    ordered = sorted(events, key=lambda e: (e.get("ts", 0), -e.get("dur", 0)))
    try:
        _, again = _gaps(impl, ordered, category)
        if _same_gaps(again, _ref_gaps(ordered, category)):
            return HINT_SORT
    except checks.CheckFailed:
        pass
    starts = {e["ts"] for e in _ranges(events, category)}
    if any(a in starts and not any(_close(a, w[0]) for w in want.get(p, []))
           for p, g in got.items() for a, _ in g):
        return HINT_GAP_ENDS
    return HINT_BOUNDS


def _latency_hint(events, got, want):
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = {e["args"].get("correlation"): e for e in _ranges(events, "kernel")}
    if set(got) - set(want):
        extra = next(iter(set(got) - set(want)))
        if extra in launches and extra not in kernels:
            return HINT_NOT_KERNEL
        return HINT_CORRELATION
    missing = set(want) - set(got)
    if missing and all(launches[c]["cat"] == "cuda_driver" for c in missing):
        return HINT_DRIVER
    if missing:
        return HINT_CORRELATION
    if all(_close(got[c], -want[c]) for c in want) and any(want.values()):
        return HINT_SIGN
    if all(_close(got[c], want[c] - launches[c]["dur"]) for c in want):
        return HINT_LAUNCH_START
    return HINT_CORRELATION


# ---------------------------------------------------------------------------------------------
# expectations

def _expect_summary(impl, events, name_filter, category, where):
    what, got = _summary(impl, events, name_filter, category)
    want = _ref_summary(events, name_filter, category)
    if not _same_rows(got, want):
        name = next((n for n in sorted(want.keys() | got.keys(), key=str)
                     if n not in got or n not in want or got[n] != want[n]), None)
        shown = (f"{name!r}: returned {got.get(name, 'nothing')}, expected {want.get(name, 'nothing')}"
                 if name is not None else "")
        checks.fail(f"{what} on {where}: {shown}",
                    _summary_hint(events, name_filter, category, got, want))


def _expect_gaps(impl, events, category, where):
    what, got = _gaps(impl, events, category)
    want = _ref_gaps(events, category)
    if not _same_gaps(got, want):
        pid = next((p for p in sorted(want.keys() | got.keys(), key=str)
                    if not _same_gaps({0: got.get(p, [])}, {0: want.get(p, [])})), None)
        checks.fail(f"{what} on {where}: for pid {pid!r} returned {got.get(pid, [])[:6]}, "
                    f"expected {want.get(pid, [])[:6]}", _gaps_hint(impl, events, category, got, want))


def _expect_latency(impl, events, where):
    what, got = _latency(impl, events)
    want = trace.launch_latency(copy.deepcopy(events))
    if got.keys() != want.keys() or not all(_close(got[c], want[c]) for c in want):
        corr = next((c for c in sorted(want.keys() | got.keys(), key=str)
                     if c not in got or c not in want or not _close(got[c], want[c])), None)
        checks.fail(f"{what} on {where}: correlation {corr!r}: returned {got.get(corr, 'nothing')}, "
                    f"expected {want.get(corr, 'nothing')}", _latency_hint(events, got, want))


# ---------------------------------------------------------------------------------------------
# the checks

def check_summary(impl, rng):
    """kernel_summary: launches, total and mean microseconds per kernel name (substring filter,
    one category, zero-length kernels counted) on shuffled GPU traces"""
    for n, devices in ((int(rng.integers(12, 30)), (0,)), (int(rng.integers(12, 30)), (0, 1))):
        events = _gpu_trace(rng, n, devices=devices)
        where = f"a GPU trace of {n} steps on {len(devices)} device(s)"
        for name_filter in ("", "fa2", "kernel"):
            _expect_summary(impl, events, name_filter, "kernel", where)
        _expect_summary(impl, events, "fa2", "user_annotation", where)
        _expect_summary(impl, events, "aten::", "cpu_op", where)
    events, _ = _nested_ops(rng)
    _expect_summary(impl, events, "", "cpu_op", "nested host operators (one of zero length)")


def check_gaps_nested(impl, rng):
    """idle_gaps: nested host operators (a parent around its children), back to back and
    zero-length ones, shuffled"""
    events, category = _nested_ops(rng)
    _expect_gaps(impl, events, category, "nested host operators, shuffled")


def check_gaps_streams_and_devices(impl, rng):
    """idle_gaps: overlapping kernels on two streams of one device, and a second device"""
    events, category = _two_streams(rng)
    _expect_gaps(impl, events, category, "kernels on two streams of device 0 and on device 1")


def check_gaps_random(impl, rng):
    """idle_gaps on shuffled GPU traces (several streams and devices, zero-length kernels, memcpys)"""
    for devices, streams in (((0,), 1), ((0,), 3), ((0, 1), 2)):
        n = int(rng.integers(15, 40))
        events = _gpu_trace(rng, n, devices=devices, n_streams=streams)
        where = f"a GPU trace of {n} steps, {len(devices)} device(s) with {streams} stream(s)"
        _expect_gaps(impl, events, "kernel", where)
        _expect_gaps(impl, events, "cpu_op", where)


def check_launch_latency(impl, rng):
    """launch_latency: each kernel's start minus its launch call's start, linked by correlation
    (runtime and driver launches, a memcpy, a sync, kernels launched before the window)"""
    _expect_latency(impl, _launches(rng), "runtime and driver launches on two streams")
    for devices in ((0,), (0, 1)):
        n = int(rng.integers(12, 30))
        _expect_latency(impl, _gpu_trace(rng, n, devices=devices, n_streams=2),
                        f"a GPU trace of {n} steps on {len(devices)} device(s)")


def check_empty(impl, rng):
    """an empty trace, and one without the category asked for: nothing found"""
    host = int(rng.integers(1000, 60000))
    only_host = _meta(host, host, "python") + [_x("cpu_op", "aten::add", host, host, 10, 3)]
    for events, where in (([], "an empty trace"), (only_host, "a trace of host operators only")):
        _expect_summary(impl, events, "", "kernel", where)
        _expect_gaps(impl, events, "kernel", where)
        _expect_latency(impl, events, where)


def _record(device):
    """A real torch.profiler trace of a few small steps, each in a record_function range."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    x = torch.randn(48, 48, device=device)
    with profile(activities=activities) as prof:
        for _ in range(3):
            with record_function("attention_step"):
                y = (x @ x).softmax(-1) @ x
            y.sum().item()                         # host work between the steps
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]


def check_real_trace(impl, rng):
    """a trace recorded here by torch.profiler (CPU; CUDA too on a GPU): operators, annotations,
    their gaps and (on a GPU) kernels and launch latencies"""
    import torch

    for name, args in (("kernel_summary", ("", "kernel")), ("idle_gaps", ("kernel",)), ("launch_latency", ())):
        _call(impl, name, [], *args)               # an unfinished function stops here, before recording
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        events = _record(device)
        where = f"a real {device.upper()} trace of three steps"
        _expect_summary(impl, events, "attention_step", "user_annotation", where)
        _expect_summary(impl, events, "aten::", "cpu_op", where)
        _expect_gaps(impl, events, "user_annotation", where)
        _expect_gaps(impl, events, "cpu_op", where)
        _expect_latency(impl, events, where)
        if device == "cuda":
            _expect_summary(impl, events, "", "kernel", where)
            _expect_gaps(impl, events, "kernel", where)


CHECKS = [check_summary, check_gaps_nested, check_gaps_streams_and_devices, check_gaps_random,
          check_launch_latency, check_empty, check_real_trace]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex07c(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
