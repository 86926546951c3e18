"""`flashlib.course.check`, the `flashlib` command, and instructor grading of a folder of students.

The grading test builds a class of four: one who solved everything, one who did nothing (and
lost a file), one whose files crash or do not parse, one whose code never returns; each
(student, exercise) runs in a subprocess (about 2.5 s each, mostly `import torch`) with a
10 s limit, so it takes about 12 s on 2 cores.
"""
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashlib.course import check, checks, classroom, self_check
from flashlib import course
from flashlib.course.cli import main

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "ex01_safe_softmax.py"
MUTANT = ROOT / "tests" / "mutants" / "ex01_no_max_subtraction.py"


@pytest.mark.parametrize("name", ["ex01", "1", "01", 1, "ex01_safe_softmax",
                                  "exercises/ex01_safe_softmax.py"])
def test_exercise_names_resolve(name):
    assert course.resolve(name, ROOT) == "ex01_safe_softmax"


def test_check_passes_the_solution_and_says_so(capsys):
    assert check("ex01", impl="solutions") is True
    out = capsys.readouterr().out
    assert "ex01 passed" in out and out.count("  ok  ") == len(course.load_grader(
        "ex01_safe_softmax", ROOT).CHECKS)


def test_check_unsolved_stub_says_not_done(tmp_path, capsys):
    stub = tmp_path / "ex01_safe_softmax.py"
    stub.write_text("def safe_softmax(x):\n    raise NotImplementedError('ex01')\n")
    assert check("ex01", path=stub) is False
    out = capsys.readouterr().out
    assert "ex01 not done yet" in out and "replace the NotImplementedError" in out


def test_check_reports_instead_of_raising(tmp_path, capsys):
    broken = tmp_path / "ex01_safe_softmax.py"
    broken.write_text("def safe_softmax(x)\n    return x\n")                    # missing colon
    assert check("ex01", path=broken) is False
    assert "SyntaxError" in capsys.readouterr().out
    broken.write_text("def safe_softmax(x):\n    return undefined_name\n")
    assert check("ex01", path=broken) is False
    out = capsys.readouterr().out
    assert "NameError" in out and "line 2" in out
    broken.write_text("import numpy as np\ndef softmax(x):\n    return x\n")     # renamed
    assert check("ex01", path=broken) is False
    assert "defines no function safe_softmax" in capsys.readouterr().out
    assert check("ex77") is False
    assert "unknown exercise" in capsys.readouterr().out
    assert check("ex01", path=tmp_path / "nowhere.py") is False
    assert "missing" in capsys.readouterr().out


def test_check_reads_the_file_fresh_every_call(tmp_path, capsys):
    """An edit made within the same second, keeping the file size, is still seen."""
    good = SOLUTION.read_text()
    bad = good.replace("m = x.max(axis=-1, keepdims=True)", "m = x.min(axis=-1, keepdims=True)")
    assert bad != good and len(bad) == len(good)
    work = tmp_path / "ex01_safe_softmax.py"
    work.write_text(good)
    assert check("ex01", path=work) is True
    work.write_text(bad)
    assert check("ex01", path=work) is False
    assert "not its min" in capsys.readouterr().out


@pytest.mark.parametrize("where, text", [
    ("in the function", "def safe_softmax(x):\n    i = 0\n    while True:\n        i += 1\n"),
    ("on import", "import time\n\nwhile True:\n    time.sleep(0.01)\n"),
], ids=["in the function", "on import"])
def test_check_stops_a_loop_that_never_ends(tmp_path, capsys, where, text):
    """A learner's endless loop does not hang the check cell: stopped after the time limit, the
    report says so, names the line, and the thread running it is gone."""
    import threading
    import time

    hang = tmp_path / "ex01_safe_softmax.py"
    hang.write_text(text)
    began = time.monotonic()
    assert check("ex01", path=hang, timeout=1.5) is False
    assert time.monotonic() - began < 8
    out = capsys.readouterr().out
    assert "stopped after 1.5 s" in out and "a loop that never ends" in out, out
    assert re.search(r"line [34]\b", out), out
    assert not any(t.name == "flashlib-check" for t in threading.enumerate())
    assert check("ex01", path=SOLUTION, timeout=30) is True     # and the next check runs as usual


def test_check_has_the_time_limit_of_grade():
    import inspect

    assert self_check.TIME_LIMIT_S == inspect.signature(classroom.grade).parameters["timeout"].default


@pytest.mark.parametrize("mutant, offending", [
    ("ex07_dot_dtype", "tl.dot(p, v"), ("ex07_python_math_exp", "math.exp("),
    ("ex07_return_order", None)])
def test_triton_errors_name_the_error_the_line_and_a_hint(capsys, mutant, offending):
    """Inside a kernel run by Triton's interpreter: the learner's own error, not the nested
    InterpreterError('InterpreterError(...)') wrappers; the learner's line inside the kernel
    (not the launcher's); a hint."""
    file = ROOT / "tests" / "mutants" / f"{mutant}.py"
    assert check("ex07", path=file, seed=1) is False
    out = capsys.readouterr().out
    assert "InterpreterError" not in out and "hint: " in out, out
    if offending is not None:
        line = next(n for n, text in enumerate(file.read_text().splitlines(), 1) if offending in text)
        assert f"{file.name}, line {line})" in out, out


def test_failure_report_carries_a_hint(capsys):
    assert check("ex01", path=MUTANT, seed=3) is False
    out = capsys.readouterr().out
    assert "FAIL" in out and "hint: matches only for small inputs" in out
    assert "FLASHLIB_SEED=3" in out


def test_cli_check_exit_codes(capsys):
    assert main(["check", "ex01", "--impl", "solutions"]) == 0
    assert main(["check", "ex01", "--path", str(MUTANT)]) == 1
    assert main(["check", "--all", "--impl", "solutions"]) == 0
    n = len(course.list_exercises(ROOT))
    assert f"{n} of {n} exercises passed" in capsys.readouterr().out
    assert main(["check"]) == 2
    with pytest.raises(SystemExit):
        main(["no-such-command"])


def _student(root, name, files):
    folder = root / name
    folder.mkdir()
    for file, text in files.items():
        (folder / file).write_text(text)


def test_grade_a_class(tmp_path, capsys):
    subs = tmp_path / "submissions"
    subs.mkdir()
    solved = {p.name: p.read_text() for p in (ROOT / "solutions").glob("ex0[01]_*.py")}
    stubs = {p.name: p.read_text() for p in (ROOT / "exercises").glob("ex0[01]_*.py")}
    _student(subs, "ada", solved)
    _student(subs, "bob", {"ex01_safe_softmax.py": stubs["ex01_safe_softmax.py"]})  # no ex00
    _student(subs, "cyd", {"ex00_roofline.py": "import os\nos._exit(3)\n",
                           "ex01_safe_softmax.py": "def safe_softmax(x)\n    return x\n"})
    # "abe" sorts first, so the hanging file's time limit runs beside the others' grading
    _student(subs, "abe", {"ex00_roofline.py": stubs["ex00_roofline.py"],
                           "ex01_safe_softmax.py": "import time\n\ndef safe_softmax(x):\n"
                                                   "    while True:\n        time.sleep(0.1)\n"})
    out = tmp_path / "grades.csv"
    rows = classroom.grade(subs, out=out, timeout=10, jobs=3, exercises=["ex00", "ex01"],
                         progress=False, unconfined=True)   # grades here whether confined or not
    status = {(r["student"], r["exercise"][:4]): r for r in rows}
    assert len(rows) == 8
    assert status["ada", "ex00"]["status"] == status["ada", "ex01"]["status"] == "passed"
    assert status["ada", "ex01"]["passed"] == status["ada", "ex01"]["total"] > 0
    assert status["bob", "ex00"]["status"] == "missing"
    assert status["bob", "ex01"]["status"] == "not done"
    assert status["cyd", "ex00"]["status"].startswith("crashed (exit code 3)")
    assert status["cyd", "ex01"]["status"].startswith("error") and \
        "SyntaxError" in status["cyd", "ex01"]["status"]
    assert status["abe", "ex00"]["status"] == "not done"
    assert status["abe", "ex01"]["status"].startswith("timeout")
    assert all(r["passed"] == 0 for r in rows if r["student"] != "ada")

    with open(out, newline="") as f:
        saved = list(csv.DictReader(f))
    assert list(saved[0]) == ["student", "exercise", "passed", "total", "status", "confinement"]
    assert [(r["student"], r["status"]) for r in saved] == \
        [(r["student"], r["status"]) for r in rows]
    table = capsys.readouterr().out
    assert "ada" in table and "timeout" in table and "missing" in table


def test_console_script_grades_in_a_subprocess(tmp_path):
    """`python -m flashlib.course.cli` is what the `flashlib` console script runs."""
    subs = tmp_path / "subs"
    shutil.copytree(ROOT / "solutions", subs / "ada", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "flashlib.course.cli", "grade", str(subs),
                             "--exercises", "ex00", "--out", str(tmp_path / "g.csv"),
                             "--timeout", "30", "--unconfined"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ada" in result.stdout
    assert re.search(r"^ada,ex00_roofline,(\d+),\1,passed,", (tmp_path / "g.csv").read_text(), re.M)


def test_check_without_the_course_folder_says_so(monkeypatch, capsys):
    monkeypatch.setattr(course.files, "find_root", lambda: None)
    assert check("ex01") is False
    out = capsys.readouterr().out
    assert "cannot find the course's tests/exercises/ folder" in out and "pip install -e ." in out


def test_a_failed_comparison_says_where_and_shows_distinct_values():
    """Which entries, which rows, and values printed with enough digits to differ."""
    expected = np.ones((2, 3, 4))
    actual = expected.copy()
    actual[1, 2, 3] = 1 + 3e-12                     # equal to 9 digits: 17 are printed
    actual[0, 0, 1] = np.nan
    with pytest.raises(checks.CheckFailed) as failure:
        checks.expect_close(actual, expected, baseline=expected, dtype=np.dtype(np.float64),
                            name="out", hint="the hint")
    text = str(failure.value)
    assert "2 of 24 entries off, in rows 0, 2 (of 3)" in text
    assert "worst at index (0, 0, 1): returned nan, expected 1" in text
    assert text.rstrip().endswith("hint: the hint")
    first, second = checks._distinct(1 + 3e-12, 1.0)
    assert first != second and float(first) == 1 + 3e-12
