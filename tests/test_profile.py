"""flashlib.teach.profile (occupancy, compiled kernels' resources, profiler tables, the committed
report) and the CPU parts of tools/profile_kernels.py (arguments, counts, ncu's CSV, the
report's files), on a CPU. One test compiles a small kernel for sm90 in a child process with
Triton's interpreter off (about 5 s)."""
import importlib.util
import json
import shlex
import types

import pytest
import torch

from flashlib.kernels import config
from flashlib.teach import profile

ROOT = profile.Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("profile_kernels", ROOT / "tools" / "profile_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (num_warps, registers, shared bytes, gpu) -> (blocks per SM, occupancy, limits), worked by hand
# from the rules in profile.occupancy's docstring
HAND_COMPUTED = [
    # 168 x 32 = 5376 registers a warp, 16384 // 5376 = 3 a sub-partition, 12 an SM: 3 blocks;
    # 65536 + 1024 = 66560 bytes a block, 233472 // 66560 = 3
    ((4, 168, 64 << 10, "h100"), (3, 12 / 64, {"registers": 3, "shared memory": 3, "warps": 16, "blocks": 32})),
    # 3200 registers a warp are allocated as 3328: 16384 // 3328 = 4 a part, 16 warps, 4 blocks
    # (5 if not rounded); 1 KB reserve only: 233472 // 1024 = 228
    ((4, 100, 0, "h100"), (4, 16 / 64, {"registers": 4, "shared memory": 228, "warps": 16, "blocks": 32})),
    # 2560 a warp: 6 a part, 24 an SM (the whole file / 2560 would be 25)
    ((1, 80, 2048, "h100"), (24, 24 / 64, {"registers": 24, "shared memory": 76, "warps": 64, "blocks": 32})),
    # 56 KB + 1 KB = 58368 bytes: exactly 4 in 228 KB (3 if divided into 227 KB)
    ((4, 32, 56 << 10, "h100"), (4, 16 / 64, {"registers": 16, "shared memory": 4, "warps": 16, "blocks": 32})),
    # 114 KB + 1 KB twice is over 228 KB: 1 block
    ((8, 128, 114 << 10, "h100"), (1, 8 / 64, {"registers": 2, "shared memory": 1, "warps": 8, "blocks": 32})),
    # few registers: 21 blocks by registers, but 64 warp slots hold 16 blocks of 4 warps
    ((4, 24, 0, "h100"), (16, 1.0, {"registers": 21, "shared memory": 228, "warps": 16, "blocks": 32})),
    # 16 warps of 255 (8192 a warp): 2 a part, 8 an SM, fewer than one block's 16
    ((16, 255, 16 << 10, "h100"), (0, 0.0, {"registers": 0, "shared memory": 13, "warps": 4, "blocks": 32})),
    # over the 227 KB a block may use: 0
    ((4, 64, 228 << 10, "h100"), (0, 0.0, {"registers": 8, "shared memory": 0, "warps": 16, "blocks": 32})),
    # A100: 80 KB + 1 KB into 164 KB: 2
    ((4, 128, 80 << 10, "a100"), (2, 8 / 64, {"registers": 4, "shared memory": 2, "warps": 16, "blocks": 32})),
    # L4: 48 warp slots, 24 blocks; 3072 a warp: 5 a part, 20 an SM, 2 blocks of 8 warps
    ((8, 96, 32 << 10, "l4"), (2, 16 / 48, {"registers": 2, "shared memory": 3, "warps": 6, "blocks": 24})),
    # T4: no reserve, so a block without shared memory is not limited by it; 32 warp slots
    ((4, 32, 0, "t4"), (8, 1.0, {"registers": 16, "shared memory": 16, "warps": 8, "blocks": 16})),
    # T4: 256-byte units: 21800 -> 22016 bytes, 2 fit in 64 KB (3 unrounded)
    ((4, 40, 21800, "t4"), (2, 8 / 32, {"registers": 12, "shared memory": 2, "warps": 8, "blocks": 16})),
]


@pytest.mark.parametrize("args, expected", HAND_COMPUTED, ids=lambda x: str(x))
def test_occupancy_matches_hand_computed_cases(args, expected):
    got = profile.occupancy(*args)
    assert (got.blocks_per_sm, got.limits) == (expected[0], expected[2])
    assert got.occupancy == pytest.approx(expected[1], rel=1e-12)


def test_occupancy_names_the_binding_limits_and_leaves_unknown_registers_out():
    assert profile.occupancy(4, 168, 64 << 10).limited_by == ["registers", "shared memory"]
    unknown = profile.occupancy(4, None, 64 << 10)
    assert "registers" not in unknown.limits and unknown.blocks_per_sm == 3
    with pytest.raises(ValueError):
        profile.occupancy(0, 32, 0)


def test_sm_limits_agree_with_the_kernel_configs_and_the_exercise():
    for gpu, target in config.TARGETS.items():
        sm = profile.sm_limits(gpu)
        assert sm.shared_per_block == target.smem                        # what configs are sized to
        assert sm.shared_per_block == sm.shared_per_sm - sm.reserved_shared_per_block
        assert profile.sm_limits(target.capability) == sm
    assert profile.sm_limits("h200") == profile.SM_LIMITS["h100"]
    solution = profile.Path(ROOT / "solutions" / "ex00_roofline.py")
    spec = importlib.util.spec_from_file_location("ex00_solution", solution)
    ex00 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex00)
    for name, gpu in (("H100", "h100"), ("A100", "a100"), ("L4", "l4"), ("T4", "t4")):
        assert profile.sm_limits(getattr(ex00, name))[1:] == profile.SM_LIMITS[gpu][1:]   # all but the name
        for args, _ in HAND_COMPUTED:
            assert ex00.occupancy(*args[:3], getattr(ex00, name)) == tuple(profile.occupancy(*args[:3], gpu))


def test_resource_usage_is_parsed_from_cuobjdump_text():
    text = ("\nResource usage:\n Common:\n  GLOBAL:11 CONSTANT[4]:8\n Function fa2_kernel:\n"
            "  REG:255 STACK:472 SHARED:1024 LOCAL:0 CONSTANT[0]:656 TEXTURE:0 SURFACE:0 SAMPLER:0\n")
    assert profile.parse_resource_usage(text) == dict(registers=255, stack=472, local=0, shared=1024)
    assert profile.parse_resource_usage(text, "fa2_kernel")["stack"] == 472
    with pytest.raises(ValueError):
        profile.parse_resource_usage(text, "other_kernel")


def test_kernel_table_from_fake_gpu_events_and_a_real_cpu_trace():
    cuda = torch.autograd.DeviceType.CUDA
    events = [types.SimpleNamespace(key="_fa2_fwd_kernel", count=5, device_type=cuda, self_device_time_total=3500.0),
              types.SimpleNamespace(key="elementwise", count=10, device_type=cuda, self_device_time_total=500.0),
              types.SimpleNamespace(key="aten::empty", count=7, device_type=torch.autograd.DeviceType.CPU,
                                    self_cpu_time_total=90.0, self_device_time_total=0.0)]
    rows = profile.kernel_table(events)
    assert [r["name"] for r in rows] == ["_fa2_fwd_kernel", "elementwise"]     # GPU kernels only
    assert rows[0]["mean_us"] == 700.0 and rows[0]["share"] == pytest.approx(0.875)
    assert "_fa2_fwd_kernel" in profile.format_table(rows)
    x = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            x @ x
    cpu_rows = profile.kernel_table(prof)
    assert any(r["name"] == "aten::mm" and r["calls"] == 3 for r in cpu_rows)
    assert all(r["where"] == "CPU" for r in cpu_rows)


def test_load_report_finds_h100_then_h200_and_none_before(tmp_path):
    assert profile.load_report(tmp_path) == (None, None)
    assert "not" in profile.missing_report_message()
    h200 = tmp_path / "benchmarks" / "results" / "h200" / "profile"
    h200.mkdir(parents=True)
    (h200 / "report.json").write_text(json.dumps({"env": {"gpu": "H200"}}))
    path, report = profile.load_report(tmp_path)
    assert path.parent == h200 and report["env"]["gpu"] == "H200"
    h100 = tmp_path / "benchmarks" / "results" / "h100" / "profile"
    h100.mkdir(parents=True)
    (h100 / "report.json").write_text(json.dumps({"env": {"gpu": "H100"}}))
    assert profile.load_report(tmp_path)[1]["env"]["gpu"] == "H100"


@pytest.mark.skipif(profile._tool("cuobjdump") is None, reason="no cuobjdump (Triton ships one)")
def test_a_kernel_compiled_for_sm90_on_this_machine_reports_its_resources():
    rows = profile.compile_in_child("""
        import torch
        from flashlib.kernels import primer
        primer.softmax(torch.randn(4, 1000, dtype=torch.float16))
        """, gpu="h100")
    (row,) = rows
    r = row["resources"]
    assert row["kernel"] == "softmax_kernel" and r["target"] == "sm90" and r["source"] == "cuobjdump"
    assert 0 < r["registers"] <= 255 and r["spills"] >= 0 and r["shared"] >= 0
    assert r["num_warps"] == row["config"]["num_warps"] == 4 and row["config"]["BLOCK"] == 1024
    assert row["occupancy"] == profile.occupancy(4, r["registers"], r["shared"], "h100")._asdict()


# ---------------------------------------------------------------------------------------------
# tools/profile_kernels.py, without a GPU

NCU_CSV = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python3","host","_fa2_fwd_kernel","1","7","(128, 1, 1)","(2048, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","us","712.35"
"0","123","python3","host","_fa2_fwd_kernel","1","7","(128, 1, 1)","(2048, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","61.2"
"0","123","python3","host","_fa2_fwd_kernel","1","7","(128, 1, 1)","(2048, 1, 1)","0","9.0","Occupancy","Achieved Occupancy","%","11.9"
"0","123","python3","host","_fa2_fwd_kernel","1","7","(128, 1, 1)","(2048, 1, 1)","0","9.0","Occupancy","Block Limit Registers","block","2"
"0","123","python3","host","_fa2_fwd_kernel","1","7","(128, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","ratio","0.5"
"0","123","python3","host","_fa2_fwd_kernel","1","7","(128, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","ratio","1,234.5"
'''


def test_script_arguments_counts_and_ncu_csv():
    script = _script()
    args = script.parse_args(["out/profile"])
    assert str(args.outdir) == "out/profile" and args.cases == script.FORWARD_CASES and not args.no_ncu
    assert script.parse_args(["o", "--cases", "flashlib_fa2_d64", "--no-ncu"]).cases == ["flashlib_fa2_d64"]
    with pytest.raises(SystemExit):
        script.parse_args(["o", "--cases", "no_such_case"])
    c = script.counts("flashlib_fa2_d64")
    assert c["flops"] == 4 * 4 * 16 * 4096 ** 2 * 64 and c["exps"] == 4 * 16 * 4096 ** 2
    model = script.roofline(c["flops"], c["hbm_bytes"], 0.715, 760e12, 2.97e12)     # lesson 07's log
    assert model["bound"] == "compute" and model["fraction"] == pytest.approx(0.506, abs=0.002)
    (launch,) = script.parse_ncu_csv(NCU_CSV)
    assert launch["kernel"] == "_fa2_fwd_kernel"
    summary = script.ncu_summary(launch)
    assert summary["duration_us"] == 712.35 and summary["achieved_occupancy_pct"] == 11.9
    assert summary["block_limit_registers"] == 2 and list(summary["stalls"]) == ["long_scoreboard", "wait"]


def _fake_report(cases):
    kernel = dict(kernel="_fa2_fwd_kernel", config={"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
                  grid=(2048, 1, 1), programs=2048, calls=1,
                  resources=dict(name="_fa2_fwd_kernel", target="sm90", num_warps=4, num_stages=3, registers=200,
                                 spills=0, shared=32768, source="driver"),
                  cubin=dict(registers=200, stack=0, local=0, shared=1024, local_stores=0, local_loads=0),
                  occupancy=profile.occupancy(4, 200, 32768)._asdict(), limited_by=["registers"],
                  driver_blocks_per_sm=2, waves=8)
    record = dict(impl="flashlib", B=4, H=16, N=4096, D=64, dtype="float16", causal=False, ms=1.0, tflops=275.0,
                  fraction_of_measured_peak=0.5, fraction_of_datasheet_peak=0.3, errors=[],
                  roofline=dict(model_ms=0.4, fraction=0.4), kernels=[kernel],
                  profiler=[dict(name="_fa2_fwd_kernel", where="CUDA", calls=5, total_us=5000.0, mean_us=1000.0,
                                 share=1.0)], ncu="ncu not available")
    return dict(env=dict(gpu="FAKE GPU (not measured)", torch="x", triton="y", cuda="z", date="d", autotune=True),
                peaks=dict(measured_fp16_flops=5e14, datasheet_fp16_flops=9e14, measured_bandwidth=3e12),
                cases={name: record for name in cases})


def test_script_writes_and_merges_its_report(tmp_path):
    script = _script()
    json_path, md_path = script.write_report(_fake_report(["flashlib_fa2_d64"]), tmp_path)
    text = md_path.read_text()
    assert "_fa2_fwd_kernel" in text and "ncu not available" in text and "FAKE GPU" in text
    script.write_report(_fake_report(["ex07b_solution_d64"]), tmp_path)      # a run of another case
    assert set(json.loads(json_path.read_text())["cases"]) == {"flashlib_fa2_d64", "ex07b_solution_d64"}


BACKWARD_CASES = ["fa3_bwd_2wg_d128", "fa3_bwd_2wg_split_d128", "sdpa_cudnn_bwd_d128", "fa3_bwd_2wg_d64",
                  "sdpa_cudnn_bwd_d64", "fa3_bwd_wide_d64", "fa3_bwd_wide_m64_d128"]


def test_script_backward_cases_are_opt_in_and_counted():
    script = _script()
    assert not set(BACKWARD_CASES) & set(script.parse_args(["o"]).cases)    # the lessons' report: forward only
    assert set(script.FORWARD_CASES) | set(BACKWARD_CASES) == set(script.CASES)
    command = next(line for line in script.__doc__.replace("\\\n", " ").splitlines() if "profile_backward" in line)
    args = script.parse_args(shlex.split(command)[2:])                      # the docstring's GPU command
    assert args.cases == BACKWARD_CASES and args.outdir.name == "profile_backward"
    B, H, N, D = 4, 16, 4096, 128
    forward, backward = script.counts("flash_attention_d128"), script.counts("fa3_bwd_2wg_split_d128")
    assert backward["flops"] == 2.5 * forward["flops"] == 10 * B * H * N * N * D
    assert backward["hbm_bytes"] == 8 * B * H * N * D * 2 + 3 * B * H * N * 4   # 8 float16 tensors, 3 float32 rows
    assert backward["exps"] == forward["exps"] == B * H * N * N
    assert script.counts("sdpa_cudnn_bwd_d128") == backward
    assert script.counts("fa3_bwd_2wg_d64")["flops"] * 2 == backward["flops"]
    for name, case in script.CASES.items():
        assert script.describe(name).startswith("Backward" if name in BACKWARD_CASES else "Forward")
        assert case.get("variant", "") in script.describe(name)


def test_the_longest_ncu_launch_is_found_across_units():
    rows = NCU_CSV.splitlines()[:2] + [
        f'"{i}","1","p","h","{kernel}","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","GPU Speed Of Light Throughput",'
        f'"Duration","{unit}","{value}"' for i, kernel, unit, value in
        ((0, "_preprocess_kernel", "us", "45.1"), (1, "_fa3_bwd_kernel", "ms", "2.31"),
         (2, "_convert_dq_kernel", "us", "60"))]
    launches = _script().parse_ncu_csv("\n".join(rows))
    assert len(launches) == 3 and _script().longest_launch(launches)["kernel"] == "_fa3_bwd_kernel"


def test_report_md_names_the_pass_measured(tmp_path):
    script = _script()
    report = _fake_report(["flashlib_fa2_d64"])      # a record without "measured", as older reports' are
    forward = report["cases"]["flashlib_fa2_d64"]
    report["cases"]["fa3_bwd_2wg_split_d128"] = dict(
        forward, impl="fa3_backward", variant="2wg_split", D=128, measured=script.describe("fa3_bwd_2wg_split_d128"),
        ncu=dict(summary=dict(duration_us=2310.0, tensor_pipe_pct=55.0, stalls={}), kernel="_fa3_bwd_kernel",
                 launches=[{}, {}, {}, {}], config_used=[dict(kernel="_fa3_bwd_kernel", config={"BLOCK_M": 64})]))
    report["cases"]["sdpa_cudnn_bwd_d128"] = dict(
        forward, impl="sdpa_cudnn_backward", D=128, measured=script.describe("sdpa_cudnn_bwd_d128"), kernels=[],
        ms=1.5, forward_backward_ms=2.1, forward_ms=0.6)
    _, md_path = script.write_report(report, tmp_path)
    sections = {s.split("\n")[0]: s.split("\n")[2:5:2] for s in md_path.read_text().split("## ")[1:]}
    first, numbers = sections["flashlib_fa2_d64"]
    assert first.startswith("Forward: flashlib's fa2_forward")
    assert numbers.startswith("B=4 H=16 N=4096 d=64 float16, not causal: 1.000 ms, 275 TFLOP/s")   # as before
    first, numbers = sections["fa3_bwd_2wg_split_d128"]
    assert first.startswith("Backward alone: flashlib's fa3_backward, variant 2wg_split")
    assert numbers.startswith("B=4 H=16 N=4096 d=128 float16, not causal: 1.000 ms")
    first, numbers = sections["sdpa_cudnn_bwd_d128"]
    assert first.startswith("Backward: SDPA cuDNN's") and "less the forward alone" in first
    assert "1.500 ms (forward + backward 2.100 ms less forward 0.600 ms)" in numbers
    text = md_path.read_text()
    assert "Nsight Compute (the longest of the 4 launches of one call, _fa3_bwd_kernel; Triton configs: " \
        "_fa3_bwd_kernel {'BLOCK_M': 64}): duration_us 2310" in text
    assert text.count("| kernel | config | regs |") == 2          # none for cuDNN's (no Triton kernels)


def test_script_refuses_to_run_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        _script().main([str(tmp_path)])
