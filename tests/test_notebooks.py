"""Notebook hygiene: every lessons/*.ipynb is committed clean and has the parts of a lesson.

Clean (tools/clean_notebooks.py): no outputs, no execution counts, metadata only the kernelspec
and language_info name. A lesson: named NN_topic.ipynb, a "You will
learn" markdown cell, and, if it sets an exercise (its markdown names exercises/exNN_*.py), a
code cell calling course.check("exNN"); no cell imports the learner's exercises/ directly (the
lesson must run with the stubs unsolved).

Executing the notebooks is nbval's job: ``pytest lessons/`` (--nbval-lax --nbval-current-env, from
pyproject's addopts; a cell fails only by raising; lessons/conftest.py holds every lesson to its
time limit). In the suite, conftest.py starts that same command for the collected lessons in a
second pytest process at the start of the session (tests/background.py), on CI's second core
while the other tests run; test_lesson_runs_under_nbval, one per lesson, fails with nbval's
report of any cell that raised.
"""
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

import background

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))


def load_cleaner():
    spec = importlib.util.spec_from_file_location("clean_notebooks", ROOT / "tools" / "clean_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cleaner = load_cleaner()


def read(path):
    return nbformat.read(path, as_version=4)


def test_there_are_lessons():
    assert len(LESSONS) >= 5, f"expected the lessons in {ROOT / 'lessons'}, found {LESSONS}"


# lessons of DESIGN.md's list still being written while a later one landed: their numbers may be
# missing; take a number out once its lesson is in
BEING_WRITTEN = set()


def test_lesson_names_are_numbered_in_order():
    numbers = []
    for path in LESSONS:
        match = re.fullmatch(r"(\d\d)_[a-z0-9_]+\.ipynb", path.name)
        assert match, f"{path.name}: lesson files are named NN_topic.ipynb"
        numbers.append(int(match.group(1)))
    missing = set(range(max(numbers) + 1)) - set(numbers)
    assert len(set(numbers)) == len(numbers) and missing <= BEING_WRITTEN, \
        f"lesson numbers {numbers} are not 00, 01, ... in order (missing {sorted(missing)})"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_notebook_is_clean(path):
    nbformat.validate(read(path))
    found = cleaner.check_file(path)
    assert not found, f"{path.name} is not clean: " + "; ".join(found) + \
        " (run python tools/clean_notebooks.py)"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_has_you_will_learn(path):
    markdown = [c.source for c in read(path).cells if c.cell_type == "markdown"]
    assert any("You will learn" in text for text in markdown), \
        f"{path.name}: no markdown cell says 'You will learn'"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_exercise_has_a_check_cell(path):
    cells = read(path).cells
    markdown = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in cells if c.cell_type == "code")
    exercises = set(re.findall(r"exercises/(ex\d\d[a-z]?)_\w+\.py", markdown))
    checked = set(re.findall(r"course\.check\(\s*[\"'](ex\d\d[a-z]?)[\"']", code))
    assert exercises <= checked, f"{path.name}: exercises {sorted(exercises - checked)} have no " \
        "course.check(...) cell"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_no_cell_imports_the_learners_exercises(path):
    for index, cell in enumerate(read(path).cells):
        if cell.cell_type == "code":
            assert not re.search(r"^\s*(from|import)\s+exercises\b", cell.source, re.M), \
                f"{path.name} cell {index} imports exercises/: the lesson must run with the " \
                "stubs unsolved, so it uses flashlib's own implementation after the check cell"


def test_cleaner_finds_and_removes_what_jupyter_adds():
    nb = read(LESSONS[0])
    code_index = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    dirty = nbformat.from_dict(nb)
    dirty.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    dirty.metadata["language_info"] = {"name": "python", "version": "3.11.7"}
    dirty.cells[code_index].outputs = [nbformat.v4.new_output("stream", text="hello\n")]
    dirty.cells[code_index].execution_count = 3
    dirty.cells[code_index].metadata["collapsed"] = True
    found = cleaner.problems(dirty)
    assert len(found) == 5, found          # widgets, language_info, output, count, cell metadata
    cleaned = cleaner.clean(dirty)
    assert cleaner.problems(cleaned) == []
    assert cleaner.canonical_text(cleaned) == cleaner.canonical_text(nb)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_runs_under_nbval(path, request):
    background.check_lesson(lesson_run(request.config, [path]), f"lessons/{path.name}")


def test_lessons_keep_their_time_limit(request):
    """lessons/conftest.py's own items (lesson_time_limit: every lesson under its limit) pass."""
    outcome = lesson_run(request.config, LESSONS)
    assert outcome["rc"] in (0, 1), outcome["log"]
    others = {nodeid: item for nodeid, item in outcome["items"].items()
              if not nodeid.partition("::")[0].endswith(".ipynb")}
    assert any(nodeid.endswith("::lesson_time_limit") for nodeid in others), \
        "lessons/conftest.py's lesson_time_limit did not run; the lesson run's output ends:\n" + \
        outcome["log"]
    bad = [f"{nodeid}: {text}" for nodeid, (status, text, _) in others.items()
           if status in ("failure", "error")]
    assert not bad, "\n".join(bad)


def lesson_run(config, paths):
    """The background lesson run's outcome (tests/background.py), or, if the session did not
    start one, nbval run now on ``paths``."""
    import tempfile

    if config.stash.get(background.JOBS, None) is not None and background.LESSON_JOB in \
            config.stash[background.JOBS]:
        return config.stash[background.JOBS].result(background.LESSON_JOB)
    with tempfile.TemporaryDirectory(prefix="flashlib-lessons-") as folder:
        return background.run_lessons(paths, folder)

