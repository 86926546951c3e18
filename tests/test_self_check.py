"""`flashlib check` within a time limit: in a thread without a GPU, in child processes with one.

On a GPU machine ``check`` grades in a child process with Triton's interpreter on and the GPU
hidden (then compiles Triton exercises once for the GPU in a second child). These tests run that
child path on the CPU: same verdicts and the same hints as in-process, a timeout that names the
check and what was running, and a child stuck where Python cannot stop it is killed.
"""
import re
import sys
from pathlib import Path

import pytest

from flashlib import course
from flashlib.course import grading, self_check

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "tests" / "mutants"


@pytest.mark.parametrize("file, status", [
    (ROOT / "solutions" / "ex07_fa2_inner_loop.py", "passed"),
    (MUTANTS / "ex07_no_rescale_acc.py", "failed"),
    (MUTANTS / "ex07b_top_left_causal.py", "failed"),
], ids=lambda x: getattr(x, "stem", x))
def test_child_grades_as_this_process_does(file, status):
    """The report from the child (interpreter on, GPU hidden) is the in-process report, word for
    word: on a GPU machine a learner gets the CPU's hints."""
    here = grading.run_checks(file.stem, path=file, seed=5, root=ROOT)
    child = self_check.run_checks_in_child(file.stem, path=file, seed=5, timeout=60, root=ROOT)
    assert child.status == here.status == status, grading.format_report(child)
    assert grading.format_report(child) == grading.format_report(here)


def test_child_timeout_names_the_check_and_the_line(tmp_path):
    hang = tmp_path / "ex01_safe_softmax.py"
    hang.write_text("def safe_softmax(x):\n    i = 0\n    while True:\n        i += 1\n")
    report = self_check.run_checks_in_child("ex01", path=hang, seed=1, timeout=2, root=ROOT)
    first = grading.check_title(course.load_grader("ex01_safe_softmax", ROOT).CHECKS[0])
    assert report.status == "timeout", report
    assert "stopped after 2 s" in report.problem and f'"{first}"' in report.problem, report.problem
    assert re.search(r"line [34]\b", report.problem) and "a loop that never ends" in report.problem


def test_child_stuck_outside_python_is_killed(tmp_path):
    """A call that holds Python's lock (here a regular expression that backtracks for hours, as a
    kernel compile may) cannot be stopped from inside: the parent kills the child, and says so
    without blaming a loop."""
    stuck = tmp_path / "ex01_safe_softmax.py"
    stuck.write_text("import re\ndef safe_softmax(x):\n"
                     "    re.match(r'(a+)+$', 'a' * 64 + 'b')\n    return x\n")
    report = self_check.run_checks_in_child("ex01", path=stuck, seed=1, timeout=1, root=ROOT,
                                            start_allowance=8)
    assert report.status == "timeout", report
    assert "stopped after 1 s" in report.problem and "compiled code" in report.problem
    assert "loop that never ends" not in report.problem


def test_time_spent_compiling_is_not_blamed_on_the_learner(tmp_path):
    """A thread stopped inside Triton's compiler is reported as compiling, with no loop hint,
    even with the learner's kernel further up the stack."""
    learner = tmp_path / "ex07_fa2_inner_loop.py"
    learner.write_text("def tile_update():\n    return compile_kernel()\n")
    compiler = str(Path(sys.prefix) / "lib" / "triton" / "compiler" / "compiler.py")
    space = {}
    exec(compile("def compile_kernel():\n    return sys._getframe()\n", compiler, "exec"),
         {"sys": sys}, space)
    exec(compile(learner.read_text(), str(learner), "exec"), {"compile_kernel": space["compile_kernel"]},
         space)
    doing, learners = self_check.what_was_running(space["tile_update"](), learner)
    assert "compiling a kernel" in doing and not learners
    frame = sys._getframe()
    doing, learners = self_check.what_was_running(frame, Path(__file__))
    assert learners and "line" in doing


def test_interpreter_scalars_index_under_any_numpy():
    """Up to Triton 3.6 the interpreter converted a kernel's scalar (a 1-element array) with
    int(array), which NumPy 2.4 refuses: every loop over a runtime bound failed on the GPU
    machines' interpreter. flashlib.runtime wraps the patcher; whatever Triton's own does, the
    index comes from .item()."""
    import numpy as np
    from triton.runtime import interpreter

    from flashlib import runtime

    if not runtime.INTERPRET:
        pytest.skip("the repair is installed only with the interpreter on")
    patched = interpreter._patch_lang_tensor
    assert getattr(patched, "_flashlib_repaired", False)

    class Scope:
        def __init__(self):
            self.attrs = {}

        def set_attr(self, obj, name, value):
            self.attrs[name] = value

    class Tensor:
        pass

    scope = Scope()
    try:
        patched(Tensor, scope)
    except TypeError:   # an older Triton whose patcher takes other arguments: not this one
        pytest.skip("this Triton's patcher takes other arguments")
    handle = type("Handle", (), {"data": np.array([7], dtype=np.int32)})()
    scalar = Tensor()
    scalar.handle = handle
    assert scope.attrs["__index__"](scalar) == 7
