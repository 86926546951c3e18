"""Time each lesson notebook that nbval executes, and hold every lesson to a time limit.

The course asks that every lesson run top to bottom on a CPU in about two minutes or less. nbval
turns each notebook into one test item per cell (``lessons/NN_topic.ipynb::Cell 3``); the kernel
starts in the first cell's setup and stops in the last cell's teardown, so summing the setup,
call and teardown durations of a notebook's items gives its whole run. The terminal summary gets
a "lesson timings" section, and one extra test, ``lesson_time_limit``, runs after the notebooks
and fails if any took over LIMIT_S seconds (a visible failure with the notebook's name, rather
than a changed exit code).

These hooks only see items collected under lessons/ (pytest scopes a conftest's item hooks to
its directory); ``pytest tests/`` never loads this file.
"""
import collections
from pathlib import Path

import pytest

LIMIT_S = 120.0
_seconds = collections.defaultdict(float)   # notebook path -> seconds of its nbval items


def _notebook(nodeid):
    path, sep, _ = nodeid.partition("::")
    return path if sep and path.endswith(".ipynb") else None


def pytest_runtest_logreport(report):
    notebook = _notebook(report.nodeid)
    if notebook is not None:
        _seconds[notebook] += report.duration


class LessonTimeLimit(pytest.Item):
    """Fails if a notebook executed in this session took over LIMIT_S seconds."""

    def runtest(self):
        slow = {path: s for path, s in _seconds.items() if s > LIMIT_S}
        if slow:
            listed = ", ".join(f"{path} took {s:.0f} s" for path, s in sorted(slow.items()))
            raise AssertionError(f"{listed}: a lesson must run in under {LIMIT_S:.0f} s on a CPU "
                                 "(use runtime.preset(cpu=..., gpu=...) for smaller CPU sizes)")

    def reportinfo(self):
        return Path(__file__), None, f"every lesson under {LIMIT_S:.0f} s"


def pytest_collection_modifyitems(session, config, items):
    # runs last: after every notebook's cells, so their durations are known
    notebook_items = [item for item in items if _notebook(item.nodeid)]
    if notebook_items:
        lessons_dir = notebook_items[0].parent.parent   # the lessons/ directory's collector
        items.append(LessonTimeLimit.from_parent(lessons_dir, name="lesson_time_limit"))


def pytest_terminal_summary(terminalreporter):
    if not _seconds:
        return
    terminalreporter.section("lesson timings")
    for path, seconds in sorted(_seconds.items()):
        flag = f"  OVER the {LIMIT_S:.0f} s limit" if seconds > LIMIT_S else ""
        terminalreporter.write_line(f"{seconds:7.1f} s  {path}{flag}")
    terminalreporter.write_line(f"{sum(_seconds.values()):7.1f} s  in all")
