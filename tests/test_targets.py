"""Every kernel compiles for the GPUs the course names, with the configs its launcher picks there,
in the shared memory that GPU has (flashlib/kernels/targets.py). Triton compiles for a named
target without that GPU, so these run on the CPU in CI: a T4 (Colab's, 64 KB a block, sm75)
and an L4/RTX-class GPU (sm89, 99 KB) are where an H100's configs (227 KB) would fail at launch.
`TRITON_INTERPRET=0 python -m flashlib.kernels.targets` prints the whole table (t4, a100, l4,
h100; every family, d=128 and d=256)."""
import json
import os
import subprocess
import sys

import pytest

# (gpu, family, head dims): the dense kernels at the two largest head dims on the two smallest
# GPUs, the other families at d=128 on a T4; about a minute of compiling on one core
CASES = [("t4", "forward", (128, 256)), ("l4", "forward", (128, 256)), ("t4", "backward", (128, 256)),
         ("t4", "block_sparse", ()), ("t4", "decode", ()), ("t4", "fa1", ()), ("t4", "primer", ())]


@pytest.fixture(scope="module")
def compiled():
    """{(gpu, family): [result per launch]}, compiled in one process without the interpreter."""
    code = ("import json, sys\nfrom flashlib.kernels import targets\n"
            f"cases = {CASES!r}\n"
            "out = {f'{g}:{f}': targets.compile_for(g, f, head_dims=d or (128,)) for g, f, d in cases}\n"
            "print('RESULTS' + json.dumps(out))\n")
    env = {**os.environ, "TRITON_INTERPRET": "0", "FLASHLIB_FAST_LAUNCH": "0"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULTS"))
    return {tuple(key.split(":")): rows for key, rows in json.loads(line[len("RESULTS"):]).items()}


def _check(compiled, gpu, family, kernels):
    rows = compiled[(gpu, family)]
    assert sorted({r["kernel"] for r in rows}) == sorted(kernels)
    for r in rows:
        assert r["fits"] and 0 <= r["shared"] <= r["limit"], r


@pytest.mark.parametrize("gpu", ["t4", "l4"])
def test_dense_forward_compiles_for(compiled, gpu):
    _check(compiled, gpu, "forward", ["_fa2_fwd_kernel"])
    assert len(compiled[(gpu, "forward")]) == 2                       # d=128 and d=256


def test_dense_backward_compiles_for_t4(compiled):
    # H100's backward configs need 160 KB at d=128; before sm80 Triton does not pipeline but keeps
    # the resident blocks twice, and the configs are sized by that rule (config.smem_bytes)
    _check(compiled, "t4", "backward", ["_dq_kernel", "_dkdv_kernel"])


@pytest.mark.parametrize("family, kernels", [
    ("block_sparse", ["_bs_fwd_kernel", "_bs_dq_kernel", "_bs_dkdv_kernel"]),
    ("decode", ["_decode_partial_kernel", "_combine_kernel"]),
    ("fa1", ["_fa1_fwd_kernel"]),
    ("primer", ["softmax_kernel", "matmul_kernel"])])
def test_kernels_compile_for_t4(compiled, family, kernels):
    _check(compiled, "t4", family, kernels)


def test_sm75_shared_memory_rule_is_what_triton_allocated(compiled):
    # the rule the configs are chosen by matches the compiler where it is tightest: the T4's
    # backward at d=128 (resident blocks counted twice, no pipeline stages)
    from flashlib.kernels import config, fa2_bwd
    for r in compiled[("t4", "backward")]:
        bm, bn, d = r["config"]["BLOCK_M"], r["config"]["BLOCK_N"], r["config"]["BLOCK_D"]
        resident, streamed = (2 * bm, 2 * bn) if r["kernel"] == "_dq_kernel" else (2 * bn, 2 * bm)
        assert config.smem_bytes(resident, streamed, r["config"]["num_stages"], d, 2,
                                 config.TARGETS["t4"]) == r["shared"], r
    t4, h100 = config.TARGETS["t4"], config.TARGETS["h100"]
    bm, bn, _, stages = fa2_bwd.DQ_CONFIGS[0]          # the H100's first choice: too big for a T4
    assert config.smem_bytes(2 * bm, 2 * bn, stages, 128, 2, t4) > t4.smem
    assert config.smem_bytes(2 * bm, 2 * bn, stages, 128, 2, h100) <= h100.smem
