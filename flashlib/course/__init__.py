"""The course's tools: checking a learner's exercise, grading a class, the `flashlib` command.

For learners, ``check("ex07")`` and ``check_all()`` (``self_check``: the lessons' check cells and
`flashlib check`) grade their files with hints. For instructors, ``classroom.grade`` (`flashlib
grade DIR`) grades a folder of students, each file in a confined process (``sandbox``). Beneath
them: ``files`` finds the course repository and loads its files (its functions are re-exported
here), ``grading`` runs a grader's checks and writes the report, ``checks`` is what the graders
in ``tests/exercises/`` are written with, ``integrity`` refuses files that borrow flashlib's
answers, and ``cli`` is the command line. Imports the core library; the core imports nothing
from here.
"""
from .files import (course_root, display_path, exercise_number, find_root, implementation_path,
                    list_exercises, load_grader, load_module, no_root_message, resolve, short)
from .self_check import check, check_all

__all__ = ["check", "check_all", "course_root", "display_path", "exercise_number", "find_root",
           "implementation_path", "list_exercises", "load_grader", "load_module",
           "no_root_message", "resolve", "short"]
