"""exercises/ is generated from solutions/ by tools/make_exercises.py and must stay in sync; each
generated stub must raise NotImplementedError when its grader calls it."""
import subprocess
import sys
from pathlib import Path

import pytest

from flashlib import course
from flashlib.course import grading

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "make_exercises.py"
SOLUTIONS = sorted((ROOT / "solutions").glob("ex[0-9]*_*.py"))
make_exercises = course.load_module(TOOL, "make_exercises_under_test")


def test_exercises_are_in_sync_with_solutions():
    result = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True,
                            text=True, cwd=ROOT)
    assert result.returncode == 0, f"exercises/ is out of date:\n{result.stderr}" \
                                   "run: python tools/make_exercises.py"


def test_every_solution_has_markers_and_a_grader():
    assert SOLUTIONS, "solutions/ holds no exNN_*.py"
    graded = set(course.list_exercises(ROOT))
    for path in SOLUTIONS:
        text = path.read_text(encoding="utf-8")
        assert "# BEGIN SOLUTION" in text and "# END SOLUTION" in text, path.name
        assert path.stem in graded, f"{path.name} has no tests/exercises/test_{path.name}"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_stub_raises_not_implemented(solution, tmp_path, grader_seed):
    stub = tmp_path / solution.name
    stub.write_text(make_exercises.make_stub(solution.read_text(encoding="utf-8"),
                                             solution.stem), encoding="utf-8")
    assert "# BEGIN SOLUTION" not in stub.read_text() and "NotImplementedError" in stub.read_text()
    report = grading.run_checks(solution.stem, path=stub, seed=grader_seed, root=ROOT)
    assert report.results and all(r.status == "not done" for r in report.results), \
        grading.format_report(report)
    assert report.status == "not done"


def test_make_stub_keeps_indentation_and_surroundings():
    source = ('def f(x):\n    """Doc."""\n    y = x + 1\n    # BEGIN SOLUTION\n'
              '    z = y * 2\n    # END SOLUTION\n    return z\n\n\nTOP = 1\n')
    stub = make_exercises.make_stub(source, "ex99_demo")
    assert stub == ('def f(x):\n    """Doc."""\n    y = x + 1\n    raise NotImplementedError('
                    "'ex99: your code goes here, then run `flashlib check ex99`')\n"
                    '    return z\n\n\nTOP = 1\n')


@pytest.mark.parametrize("source", [
    "def f():\n    # BEGIN SOLUTION\n    return 1\n",                 # never closed
    "def f():\n    return 1\n    # END SOLUTION\n",                   # END without BEGIN
    "def f():\n    return 1\n",                                       # no markers at all
])
def test_make_stub_rejects_bad_markers(source):
    with pytest.raises(make_exercises.MarkerError):
        make_exercises.make_stub(source, "ex99_demo")
