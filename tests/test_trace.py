"""flashlib.teach.trace (lesson 07, exercise 07c): a profiler trace's launches, time per kernel,
idle gaps and launch latency, on a small hand-written trace and a real CPU trace."""
import json

import pytest
import torch

from flashlib.teach import trace


def _x(cat, name, pid, tid, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


# device 0, streams 7 and 13; device 1; a host thread 99 launching them. Worked by hand:
# device 0 busy [10, 60] (stream 7's [10, 30] and stream 13's [25, 60]) and [70, 70] and [80, 90]
EVENTS = [
    {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0, "args": {"name": "GPU 0"}},
    _x("kernel", "_fa2_fwd_kernel", 0, 13, 25, 35, correlation=2),
    _x("kernel", "_fa2_fwd_kernel", 0, 7, 10, 20, correlation=1),
    _x("kernel", "fa2_kernel", 0, 7, 80, 10, correlation=4),
    _x("kernel", "fa2_kernel", 0, 7, 70, 0, correlation=3),
    _x("kernel", "fa2_kernel", 1, 7, 0, 100, correlation=5),
    _x("cuda_driver", "cuLaunchKernelEx", 99, 99, 2, 3, correlation=1),
    _x("cuda_runtime", "cudaLaunchKernel", 99, 99, 6, 4, correlation=2),
    _x("cuda_runtime", "cudaMemcpyAsync", 99, 99, 40, 4, correlation=6),
    _x("gpu_memcpy", "Memcpy DtoH", 0, 7, 45, 1, correlation=6),
    _x("cuda_driver", "cuLaunchKernelEx", 99, 99, 50, 2, correlation=3),
    _x("cpu_op", "fa2_forward", 99, 99, 1, 60),
    {"ph": "s", "id": 1, "pid": 99, "tid": 99, "ts": 2, "cat": "ac2g", "name": "ac2g"},
]


def test_summary_counts_one_category_by_substring():
    assert trace.kernel_summary(EVENTS, "fa2") == {"_fa2_fwd_kernel": (2, 55, 27.5),
                                                  "fa2_kernel": (3, 110, 110 / 3)}
    assert trace.kernel_summary(EVENTS, "fa2_kernel") == {"fa2_kernel": (3, 110, 110 / 3)}
    assert trace.kernel_summary(EVENTS, "fa2", category="cpu_op") == {"fa2_forward": (1, 60, 60.0)}
    assert trace.kernel_summary({"traceEvents": EVENTS}, "", "gpu_memcpy") == {"Memcpy DtoH": (1, 1, 1.0)}


def test_gaps_merge_streams_per_device_and_keep_zero_length_kernels():
    assert trace.idle_gaps(EVENTS) == {0: [(60, 70), (70, 80)], 1: []}
    assert trace.idle_gaps(EVENTS, "nothing") == {}


def test_latency_links_runtime_and_driver_launches_by_correlation():
    assert trace.launch_latency(EVENTS) == {1: 8, 2: 19, 3: 20}


def test_bad_trace_is_named():
    with pytest.raises(TypeError, match="trace"):
        trace.kernel_summary("trace.json")
    with pytest.raises(ValueError, match="traceEvents"):
        trace.idle_gaps({"events": []})


def test_a_real_cpu_trace(tmp_path):
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("step"):
                x @ x
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert trace.kernel_summary(events, "step", "user_annotation")["step"][0] == 3
    gaps = trace.idle_gaps(events, "user_annotation")
    assert len(gaps) == 1 and len(next(iter(gaps.values()))) == 2      # between the three steps
    assert all(a < b for a, b in next(iter(gaps.values())))
    assert trace.launch_latency(events) == {}                            # no GPU, no launches
