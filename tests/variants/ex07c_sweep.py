"""Correct variant of ex07c: the summary from lists of durations per name; the gaps by a sweep over
the start and end boundaries of each device's events (a counter of running events; at equal times
starts before ends, so back-to-back events leave no gap and a zero-length one splits a gap);
launches joined to kernels through a dict of kernels by correlation."""
from collections import defaultdict


def _complete(events, category):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == category]


def kernel_summary(events, name_filter, category="kernel"):
    durations = defaultdict(list)
    for e in _complete(events, category):
        if e["name"].find(name_filter) >= 0:
            durations[e["name"]].append(e["dur"])
    return {name: (len(d), sum(d), sum(d) / len(d)) for name, d in durations.items()}


def idle_gaps(events, category="kernel"):
    boundaries = defaultdict(list)
    for e in _complete(events, category):
        boundaries[e["pid"]] += [(e["ts"], 0), (e["ts"] + e["dur"], 1)]    # 0: start, 1: end
    gaps = {}
    for pid, marks in boundaries.items():
        running, opened, found = 0, None, []
        for t, kind in sorted(marks):
            if kind == 0:
                if running == 0 and opened is not None and t > opened:
                    found.append((opened, t))
                running += 1
            else:
                running -= 1
                if running == 0:
                    opened = t
        gaps[pid] = found
    return gaps


def launch_latency(events):
    kernels = {e["args"]["correlation"]: e for e in _complete(events, "kernel")
               if "correlation" in e.get("args", {})}
    out = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in {"cuda_driver", "cuda_runtime"}:
            corr = e.get("args", {}).get("correlation")
            if corr in kernels:
                out[corr] = kernels[corr]["ts"] - e["ts"]
    return out
