"""The benchmark harness's CPU-testable parts, and the format of every committed result file."""
import json
import math
import pathlib

import pytest
import torch

from flashlib.bench import harness as bench
from flashlib.reference import attention_naive

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*/*.json"))
RECORD_KEYS = {"op", "impl", "dtype", "B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "density", "ms",
               "tflops", "gbps", "peak_mem_gb", "ratio_vs_sdpa_flash"}


def test_check_accepts_a_right_implementation_and_rejects_a_wrong_one():
    q, k, v = bench.make_inputs(1, 4, 2, 33, 70, 16, torch.float32, "cpu")
    err, ok = bench.check(lambda q, k, v, causal: attention_naive(q, k, v, causal=causal), q, k, v, True)
    assert ok and err < 1e-5
    wrong = lambda q, k, v, causal: attention_naive(q, k, v, causal=not causal)  # noqa: E731
    assert not bench.check(wrong, q, k, v, True)[1]


def test_ratios_are_sdpa_flash_time_over_own_time_for_the_same_op_and_shape():
    shape = dict(dtype="float16", B=1, Hq=2, Hkv=2, Nq=8, Nk=8, D=16, causal=False)
    records = [dict(op="fwd", impl="sdpa_flash", ms=3.0, **shape), dict(op="fwd", impl="flashlib", ms=2.0, **shape),
               dict(op="bwd", impl="flashlib", ms=1.0, **shape), dict(op="fwd", impl="naive", ms=None, **shape)]
    bench.add_ratios(records)
    assert [r.get("ratio_vs_sdpa_flash") for r in records] == [1.0, 1.5, None, None]


def test_short_suite_ratios_table_and_plots(tmp_path, capsys):
    from flashlib.bench import short
    assert [(c["B"] * c["Nq"], c["Hq"] * c["D"]) for c in short.cases()] == \
        [(16384, 768)] * 6 + [(16384, 2048)] * 6            # GPT-sized: 16k tokens, two widths
    shape = dict(op="fwd_bwd", dtype="bfloat16", B=64, Hq=12, Hkv=12, Nq=256, Nk=256, D=64, causal=True)
    records = [dict(impl="sdpa_default", ms=0.2, host_us=150.0, **shape),
               dict(impl="sdpa_flash", ms=0.4, host_us=160.0, **shape),
               dict(impl="flashlib", ms=0.25, host_us=90.0, **shape),
               dict(impl="flashlib", ms=None, host_us=None, note="wrong", **{**shape, "Nq": 512})]
    short.add_ratios(records)
    assert [(r["ratio_vs_sdpa_default"], r["ratio_vs_sdpa_flash"]) for r in records] == \
        [(1.0, 2.0), (0.5, 1.0), (0.8, 1.6), (None, None)]
    short.print_table(records, {"forward launcher (1 kernel)": 12.5})
    printed = capsys.readouterr().out
    assert "0.80" in printed and "12.5 us" in printed and "wrong" in printed
    bench.plot(records, tmp_path / "s.png", "short", value="host_us", ylabel="us")
    assert (tmp_path / "s.png").stat().st_size > 0


def test_cli_refuses_to_time_without_a_gpu():
    from flashlib import runtime
    from flashlib.bench.__main__ import main

    if runtime.DEVICE.type == "cuda":
        pytest.skip("has a GPU")
    with pytest.raises(SystemExit):
        main(["--suite", "forward"])


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_results_follow_the_design_format(path):
    data = json.loads(path.read_text())
    assert {"gpu", "sm_count", "torch", "triton", "cuda", "date"} <= set(data["env"])
    assert data["records"], "no records"
    flops_per = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5, "block_sparse_fwd": 1.0,
                 "block_sparse_fwd_bwd": 3.5, "decode": 1.0}
    for r in data["records"]:
        assert RECORD_KEYS <= set(r), RECORD_KEYS - set(r)
        if r["op"] not in flops_per:   # whole models (--suite model): tflops counts the model's FLOPs
            assert r["ms"] is not None or r.get("note"), "a record without a time must say why"
            continue
        assert (r["ms"] is None) == (r["tflops"] is None)
        if r["ms"] is not None:   # tflops is recomputable from the shape and the time
            flops = 4 * r["B"] * r["Hq"] * r["Nq"] * r["Nk"] * r["D"] * (0.5 if r["causal"] else 1.0) * r["density"]
            assert math.isclose(r["tflops"], flops * flops_per[r["op"]] / r["ms"] / 1e9, rel_tol=1e-6)
        else:
            assert r.get("note"), "a record without a time must say why"
    assert (path.with_suffix(".png")).exists(), "a PNG plot goes beside each JSON"


def test_block_sparse_records_ratios_and_plot(tmp_path):
    from flashlib.bench import sparse as bench_sparse
    shape = dict(dtype="float16", B=1, Hq=2, Hkv=2, Nq=8, Nk=8, D=16, causal=False, gbps=None, peak_mem_gb=None)
    rec = lambda op, impl, mask, s, ms: dict(op=op, impl=impl, mask=mask, density=s, ms=ms, tflops=1.0,  # noqa: E731
                                            ratio_vs_sdpa_flash=None, ratio_vs_flex=None, **shape)
    records = [rec("block_sparse_fwd", "flashlib_dense", "dense", 1.0, 10.0),
               rec("block_sparse_fwd", "sdpa_flash", "dense", 1.0, 12.0),
               rec("block_sparse_fwd", "flashlib", "window 4", 0.25, 3.0),
               rec("block_sparse_fwd", "flex", "window 4", 0.25, 4.5)]
    bench_sparse._add_ratios(records, {("flashlib_dense", "block_sparse_fwd"): 10.0,
                                       ("sdpa_flash", "block_sparse_fwd"): 12.0})
    assert records[2]["ratio_vs_flex"] == 1.5 and records[2]["vs_density_x_dense"] == 1.2
    assert records[2]["ratio_vs_sdpa_flash"] == 4.0 and records[3].get("vs_density_x_dense") is None
    bench_sparse.plot(records, tmp_path / "p.png", "test")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_decode_check_ratios_table_and_plot(tmp_path, capsys):
    from flashlib.bench import decode as bench_decode
    q, k, v = bench.make_inputs(2, 4, 2, 1, 70, 16, torch.float32, "cpu")
    flashlib_decode = bench_decode.implementations(["flashlib"])["flashlib"]
    for seqlens in (None, [70, 9]):
        err, ok = bench_decode.check_decode(flashlib_decode, q, k, v, seqlens)
        assert ok and err < 1e-5
    ignores_lengths = lambda q, k, v, seqlens: bench_decode.naive_decode(q, k, v, None)  # noqa: E731
    assert not bench_decode.check_decode(ignores_lengths, q, k, v, [70, 9])[1]
    shape = dict(op="decode", dtype="float16", B=1, Hq=2, Hkv=2, Nq=1, Nk=4096, D=16, causal=False,
                 density=1.0)
    records = [dict(shape, impl=i, ms=ms, gbps=g, ms_graph=ms / 2, gbps_graph=2 * g)
               for i, ms, g in (("flashlib", 2.0, 1500.0), ("sdpa_flash", 3.0, 1000.0),
                                ("sdpa_cudnn", 4.0, 750.0))]
    bench_decode.add_decode_ratios(records, copy_gbps=3000.0)
    mine = records[0]
    assert mine["ratio_vs_sdpa_flash"] == 1.5 and mine["ratio_vs_sdpa_cudnn"] == 2.0
    assert mine["ratio_vs_sdpa_flash_graph"] == 1.5 and mine["copy_fraction_graph"] == 1.0
    bench_decode.plot(records, 3000.0, tmp_path / "p.png", "test")
    bench_decode.print_table(records, 3000.0)
    assert (tmp_path / "p.png").stat().st_size > 0 and "1.50" in capsys.readouterr().out
