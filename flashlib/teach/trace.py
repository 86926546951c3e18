"""Reading a ``torch.profiler`` trace (lesson 07, exercise 07c): launches, time per kernel, idle
gaps between kernels, and the latency from a launch call to its kernel.

The trace is the Chrome-trace JSON that ``prof.export_chrome_trace(path)`` writes (what
chrome://tracing and https://ui.perfetto.dev open): ``json.load`` gives a dict whose
``"traceEvents"`` is a list of events, one dict each. The functions here take that list (or the
whole dict). The fields they read, as PyTorch's profiler (Kineto) writes them:

- ``"ph"``: the event's phase; ``"X"`` is a complete event, a range with a start and a duration
  (others: ``"M"`` metadata, ``"i"`` instants, ``"s"``/``"f"`` the arrows between a launch and
  its kernel);
- ``"cat"``: what it is: ``"cpu_op"`` (a PyTorch operator on the host), ``"user_annotation"`` (a
  ``torch.profiler.record_function`` range), ``"cuda_runtime"`` and ``"cuda_driver"`` (CUDA API
  calls on the host: ``cudaLaunchKernel``, ``cuLaunchKernel``, ...), ``"kernel"`` (a kernel on the
  GPU), ``"gpu_memcpy"``, ``"gpu_memset"``, ``"gpu_user_annotation"``;
- ``"ts"``, ``"dur"``: start and duration in **microseconds** (floats; ``displayTimeUnit`` only
  sets how a viewer shows them);
- ``"pid"``, ``"tid"``: the track: for host events the process and thread, for GPU events the
  device and the stream;
- ``"args"``: for kernels, memcpys and CUDA API calls ``"correlation"``, the id CUPTI gives a
  launch call and the GPU work it started (the same number on both).

On a CPU-only machine the trace has host events only (Triton's interpreter runs a kernel inside
its launch call, which the profiler does not name): wrap each call in ``record_function`` and read
the ``"user_annotation"`` ranges instead of ``"kernel"`` events.

Limits: complete (``"X"``) events only; kernels whose launch fell outside the profiled window have
no launch event and no latency.
"""

__all__ = ["events_of", "kernel_summary", "idle_gaps", "launch_latency", "LAUNCH_CATEGORIES"]

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def events_of(trace) -> list:
    """The list of events of a trace: ``trace["traceEvents"]`` of the JSON's dict, or the list."""
    if isinstance(trace, dict):
        if "traceEvents" not in trace:
            raise ValueError("trace: a dict without 'traceEvents'; pass json.load(...) of the file "
                             "that prof.export_chrome_trace wrote, or its 'traceEvents' list")
        trace = trace["traceEvents"]
    if not isinstance(trace, (list, tuple)):
        raise TypeError(f"trace: expected the list of events (trace['traceEvents']), got "
                        f"{type(trace).__name__}")
    return list(trace)


def _ranges(trace, category):
    return [e for e in events_of(trace) if e.get("ph") == "X" and e.get("cat") == category]


def kernel_summary(trace, name_filter="", category="kernel") -> dict:
    """{name: (launches, total_us, mean_us)} of the complete events of ``category`` whose name
    contains ``name_filter``: how many there are of each name, their summed and mean durations
    (microseconds). Zero-length events count as launches."""
    rows = {}
    for e in _ranges(trace, category):
        if name_filter in e["name"]:
            count, total = rows.get(e["name"], (0, 0.0))
            rows[e["name"]] = (count + 1, total + e["dur"])
    return {name: (count, total, total / count) for name, (count, total) in rows.items()}


def idle_gaps(trace, category="kernel") -> dict:
    """{pid: [(start, end), ...]}: per device (``pid``; on the host, the process), the intervals
    between its first event of ``category`` and its last in which none of them runs, on any stream
    (``tid``), in time order, each of positive length (microseconds)."""
    by_device = {}
    for e in _ranges(trace, category):
        by_device.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    gaps = {}
    for pid, spans in by_device.items():
        spans.sort()
        found, busy_until = [], spans[0][1]
        for start, end in spans[1:]:
            if start > busy_until:
                found.append((busy_until, start))
            busy_until = max(busy_until, end)
        gaps[pid] = found
    return gaps


def launch_latency(trace) -> dict:
    """{correlation: microseconds}: for each kernel whose launch call is in the trace (a
    ``cuda_runtime`` or ``cuda_driver`` event with the same ``args["correlation"]``), the time
    from the start of that call to the start of the kernel on the GPU."""
    launches = {e["args"]["correlation"]: e["ts"] for e in events_of(trace)
                if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES
                and "correlation" in e.get("args", {})}
    return {e["args"]["correlation"]: e["ts"] - launches[e["args"]["correlation"]]
            for e in _ranges(trace, "kernel") if e.get("args", {}).get("correlation") in launches}
