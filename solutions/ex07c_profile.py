"""Exercise 07c (lesson 07): reading a profiler trace: launches, time per kernel, idle gaps, and
the latency from a launch call to its kernel.

``torch.profiler`` records what ran, on the host and on the GPU; ``prof.export_chrome_trace(path)``
writes it as Chrome-trace JSON (chrome://tracing and https://ui.perfetto.dev draw it). Read back
with ``json.load``, the file is a dict whose ``"traceEvents"`` is a list of events; each function
here takes that list, ``events``, and must leave it as it was. An event is a dict; the fields you
need:

    "ph"    the phase: only "X" events (complete events: a range with a start and a duration)
            count here; others are metadata ("M"), instants ("i"), arrows ("s", "f")
    "cat"   the category: "kernel" (a kernel on the GPU), "cuda_runtime" and "cuda_driver" (CUDA
            API calls on the host, e.g. "cudaLaunchKernel", "cuLaunchKernelEx"), "cpu_op" (a
            PyTorch operator), "user_annotation" (a torch.profiler.record_function range),
            "gpu_memcpy", "gpu_user_annotation", ...
    "name"  e.g. "_fa2_fwd_kernel"
    "ts"    start, in microseconds (a float)
    "dur"   duration, in microseconds (0 for an event too short to measure)
    "pid"   the device a GPU event ran on (on the host: the process)
    "tid"   the stream a GPU event ran on (on the host: the thread)
    "args"  a dict; for kernels and for CUDA API calls, args["correlation"] is the id that links
            a launch call to the kernel it launched (the same number on both)

The events are in no particular order, operators nest (an operator's range contains those it
calls), and kernels on different streams of one device may run at the same time.

1. ``kernel_summary(events, name_filter, category="kernel")``: for each name of the "X" events of
   ``category`` whose name contains ``name_filter`` (a substring; "" matches every name), the
   tuple (launches, total_us, mean_us): how many such events there are (zero-length ones
   included: too short to measure is not absent), the sum of their durations and its mean, in
   microseconds. Returns {name: (launches, total_us, mean_us)}.

2. ``idle_gaps(events, category="kernel")``: when was each device idle between its kernels? For
   each device (``pid``) with "X" events of ``category``: the intervals between the start of its
   first such event and the end of its last during which none of them runs, on any of its
   streams. A device is busy while any of its kernels runs (a zero-length kernel still ran: it
   splits a gap in two). Returns {pid: [(start, end), ...]}, each gap with start < end
   (back-to-back kernels leave no gap), in time order (a device with no gap may map to [] or be
   left out).

3. ``launch_latency(events)``: for each "kernel" event whose launch call is in the trace (an "X"
   event of category "cuda_runtime" or "cuda_driver" with the same args["correlation"]): the time
   from the start of the launch call to the start of the kernel. Returns {correlation: us}. Other
   GPU work (a "gpu_memcpy", say) has correlations too; it is not a kernel and is left out.

On a CPU-only machine the trace has host events only: Triton's interpreter runs a kernel inside
its launch call. The lesson wraps each call in ``torch.profiler.record_function`` and reads the
"user_annotation" ranges with the same functions. Plain Python, no flashlib; then run
``flashlib check ex07c``.
"""


def kernel_summary(events, name_filter, category="kernel"):
    """{name: (launches, total_us, mean_us)} of the "X" events of ``category`` whose name
    contains ``name_filter``."""
    # BEGIN SOLUTION
    rows = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == category and name_filter in e["name"]:
            count, total = rows.get(e["name"], (0, 0.0))
            rows[e["name"]] = (count + 1, total + e["dur"])
    return {name: (count, total, total / count) for name, (count, total) in rows.items()}
    # END SOLUTION


def idle_gaps(events, category="kernel"):
    """{pid: [(start, end), ...]}: per device, the gaps (in time order, start < end) between its
    first and last "X" event of ``category`` in which none of them runs on any stream."""
    # BEGIN SOLUTION
    spans = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == category:
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
    # END SOLUTION


def launch_latency(events):
    """{correlation: us} from the start of each kernel's launch call (cuda_runtime or
    cuda_driver, same args["correlation"]) to the start of the kernel."""
    # BEGIN SOLUTION
    launched = {}
    for e in events:
        if (e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})):
            launched[e["args"]["correlation"]] = e["ts"]
    latency = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            corr = e.get("args", {}).get("correlation")
            if corr in launched:
                latency[corr] = e["ts"] - launched[corr]
    return latency
    # END SOLUTION
