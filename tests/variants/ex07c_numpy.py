"""Correct variant of ex07c: NumPy. The summary grouped with itertools.groupby over the sorted
names; the gaps from each device's events sorted by start (np.argsort, stable) with the latest end
so far by np.maximum.accumulate; the latency from two arrays of correlations matched with
np.searchsorted."""
import itertools

import numpy as np


def kernel_summary(events, name_filter, category="kernel"):
    chosen = sorted(((e["name"], e["dur"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") == category and name_filter in e["name"]),
                    key=lambda pair: pair[0])
    out = {}
    for name, group in itertools.groupby(chosen, key=lambda pair: pair[0]):
        durations = np.array([d for _, d in group], dtype=np.float64)
        out[name] = (int(durations.size), float(durations.sum()), float(durations.mean()))
    return out


def idle_gaps(events, category="kernel"):
    chosen = [e for e in events if e.get("ph") == "X" and e.get("cat") == category]
    gaps = {}
    for pid in dict.fromkeys(e["pid"] for e in chosen):
        starts = np.array([e["ts"] for e in chosen if e["pid"] == pid], dtype=np.float64)
        ends = starts + np.array([e["dur"] for e in chosen if e["pid"] == pid], dtype=np.float64)
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        busy_until = np.maximum.accumulate(ends)                # the latest end so far
        idle = starts[1:] > busy_until[:-1]
        gaps[pid] = [(float(a), float(b)) for a, b in zip(busy_until[:-1][idle], starts[1:][idle])]
    return gaps


def launch_latency(events):
    calls = [(e["args"]["correlation"], e["ts"]) for e in events
             if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
             and "correlation" in e.get("args", {})]
    kernels = [(e["args"]["correlation"], e["ts"]) for e in events
               if e.get("ph") == "X" and e.get("cat") == "kernel" and "correlation" in e.get("args", {})]
    if not calls or not kernels:
        return {}
    ids = np.array([c for c, _ in calls], dtype=np.int64)
    order = np.argsort(ids)
    ids, starts = ids[order], np.array([t for _, t in calls], dtype=np.float64)[order]
    out = {}
    for corr, ts in kernels:
        i = int(np.searchsorted(ids, corr))
        if i < ids.size and ids[i] == corr:
            out[corr] = float(ts - starts[i])
    return out
