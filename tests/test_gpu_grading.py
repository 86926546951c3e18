"""The learner's path on a GPU machine: `flashlib check` and `flashlib grade` within their limits.

On an H100, compiling flashlib's kernels with a learner's code for every case a grader tries
took longer than the 60 s limit and blamed a right answer's "loop". These tests run what a
learner and an instructor run on a GPU box, with the real time limit: every reference answer
passes (its checks through the interpreter in a child, then the Triton kernels compiled once at a
real size), a few mutants per Triton exercise are rejected with the hint the CPU gives, and a
class of three (solved, unsolved, one mistake) gets the right scores. Each test prints its times.
"""
import shutil
import time
from pathlib import Path

import pytest

from flashlib import course
from flashlib.course import classroom, self_check

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = course.list_exercises(ROOT)
TRITON_MUTANTS = ["ex05_store_no_mask", "ex05_other_zero", "ex05b_attention_no_max",
                  "ex05b_matmul_no_k_mask", "ex06_no_division", "ex06_l_not_rescaled",
                  "ex07_no_rescale_acc", "ex07_nan_on_masked_rows", "ex07b_top_left_causal",
                  "ex07b_no_tail_mask", "ex08b_above_diagonal_unmasked", "ex09b_partial_unmasked",
                  "ex10b_ignores_seqlens"]


@pytest.mark.parametrize("exercise", EXERCISES)
def test_check_passes_the_solution_within_the_limit(exercise, capsys):
    began = time.monotonic()
    ok = self_check.check(exercise, impl="solutions", seed=1)
    seconds = time.monotonic() - began
    out = capsys.readouterr().out
    print(out, f"\n{exercise}: {seconds:.1f} s")
    assert ok, out
    if self_check._has_gpu_checks(exercise):
        why = getattr(course.load_grader(exercise), "gpu_checks_unavailable", lambda: None)()
        if why is None:
            assert "compiled for the GPU" in out and "passed, compiled for the GPU" in out, out
        else:      # ex12c off Hopper: the kernel check says why it did not run
            assert f"did not run: {why}" in out, out


@pytest.mark.parametrize("mutant", TRITON_MUTANTS)
def test_mutant_gets_the_cpus_hint(mutant, capsys):
    file = ROOT / "tests" / "mutants" / f"{mutant}.py"
    expected = course.load_module(file).EXPECTED_HINT
    began = time.monotonic()
    ok = self_check.check(mutant, path=file, seed=1)
    seconds = time.monotonic() - began
    out = capsys.readouterr().out
    print(out, f"\n{mutant}: {seconds:.1f} s")
    assert not ok and expected.lower() in out.lower(), out
    assert "stopped after" not in out, out


def test_grade_a_class(tmp_path, capsys):
    """Solved, unsolved, and solved but for one mutant, over the Triton exercises and ex01."""
    names = [n for n in EXERCISES if course.short(n) in ("ex01", "ex05", "ex05b", "ex06", "ex07",
                                                         "ex07b")]
    for student, source in (("ada", "solutions"), ("bob", "exercises"), ("eve", "solutions")):
        (tmp_path / student).mkdir()
        for name in names:
            shutil.copy(ROOT / source / f"{name}.py", tmp_path / student / f"{name}.py")
    ex07 = next(n for n in names if course.short(n) == "ex07")
    shutil.copy(ROOT / "tests" / "mutants" / "ex07_no_rescale_l.py", tmp_path / "eve" / f"{ex07}.py")
    began = time.monotonic()
    rows = classroom.grade(tmp_path, out=tmp_path / "grades.csv", timeout=self_check.TIME_LIMIT_S,
                           seed=1, progress=False, unconfined=True)
    print(capsys.readouterr().out, f"\ngraded in {time.monotonic() - began:.1f} s")
    status = {(r["student"], r["exercise"]): r for r in rows}
    for name in names:
        assert status["ada", name]["status"] == "passed", status["ada", name]
        assert status["bob", name]["status"] == "not done", status["bob", name]
        expected = "failed" if name == ex07 else "passed"
        assert status["eve", name]["status"] == expected, status["eve", name]
