"""Mutant of ex07c: idle_gaps leaves out zero-length kernels, so they no longer split a gap."""

EXPECTED_HINT = 'zero-length'


def kernel_summary(events, name_filter, category="kernel"):
    """{name: (launches, total_us, mean_us)} of the "X" events of ``category`` whose name
    contains ``name_filter``."""
    rows = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == category and name_filter in e["name"]:
            count, total = rows.get(e["name"], (0, 0.0))
            rows[e["name"]] = (count + 1, total + e["dur"])
    return {name: (count, total, total / count) for name, (count, total) in rows.items()}


def idle_gaps(events, category="kernel"):
    """{pid: [(start, end), ...]}: per device, the gaps (in time order, start < end) between its
    first and last "X" event of ``category`` in which none of them runs on any stream."""
    spans = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == category and e["dur"] > 0:
            spans.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    gaps = {}
    for pid, ranges in spans.items():
        ranges = sorted(ranges)                        # a copy: events come in any order
        found, busy_until = [], ranges[0][1]
        for start, end in ranges[1:]:
            if start > busy_until:
                found.append((busy_until, start))
            busy_until = max(busy_until, end)          # a long kernel covers the short ones inside it
        gaps[pid] = found
    return gaps


def launch_latency(events):
    """{correlation: us} from the start of each kernel's launch call (cuda_runtime or
    cuda_driver, same args["correlation"]) to the start of the kernel."""
    launched = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") \
                and "correlation" in e.get("args", {}):
            launched[e["args"]["correlation"]] = e["ts"]
    latency = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            corr = e.get("args", {}).get("correlation")
            if corr in launched:
                latency[corr] = e["ts"] - launched[corr]
    return latency
