"""Finding the course and loading its files: the repository, its exercises and their graders.

``find_root`` finds the course repository (the folder holding ``tests/exercises/``); exercise
names ("ex01", "1", "ex07b", "ex01_safe_softmax") resolve against the graders found there;
``implementation_path`` says which file is graded (the learner's ``exercises/``, the answers in
``solutions/``, or a given path); ``load_module`` runs a file as a brand-new module, compiled from
its text on disk, so a learner's edit is always seen.

Limits: only a clone of the course repository has the graders (``pip install flashlib`` alone
finds none: ``no_root_message`` says what to do). ``load_module`` runs the file in this process
with the caller's rights: it loads, it does not confine (``flashlib.course.sandbox`` does).
"""
import os
import re
import sys
import types
from pathlib import Path

_ROOT_ENV = "FLASHLIB_ROOT"


def find_root() -> Path | None:
    """The course repository: $FLASHLIB_ROOT, else next to flashlib (editable install or a
    clone), else the current directory or one of its parents."""
    candidates = []
    if os.environ.get(_ROOT_ENV):
        candidates.append(Path(os.environ[_ROOT_ENV]))
    candidates.append(Path(__file__).resolve().parents[2])
    cwd = Path.cwd().resolve()
    candidates += [cwd, *cwd.parents]
    for root in candidates:
        if (root / "tests" / "exercises").is_dir():
            return root
    return None


def course_root(root=None) -> Path | None:
    """``root`` as a Path if given, else ``find_root()``."""
    if root is not None:
        return Path(root)
    return find_root()


_NO_ROOT = ("cannot find the course's tests/exercises/ folder: flashlib is imported from {where}, "
            "which is not a clone of the course repository. Clone it and run `pip install -e .` "
            "inside, or set FLASHLIB_ROOT=/path/to/the/clone.")


def no_root_message() -> str:
    """What to do when ``find_root`` finds no course repository."""
    return _NO_ROOT.format(where=Path(__file__).resolve().parents[1])


def list_exercises(root=None) -> list[str]:
    """Exercise names with a grader, e.g. ["ex00_roofline", "ex01_safe_softmax", ...]."""
    root = course_root(root)
    if root is None:
        return []
    names = [p.stem[len("test_"):] for p in (root / "tests" / "exercises").glob("test_ex*_*.py")]
    return sorted(n for n in names if re.fullmatch(r"ex\d+[a-z]?_\w+", n))


def exercise_number(name) -> tuple[int, str] | None:
    """Which exercise a name means: (2, "") for "ex02", "2", "02", 2, "ex02_online_softmax" or
    ".../ex02_online_softmax.py"; (7, "b") for "ex07b", "7b" or "ex07b_fa2_kernel" (a second
    exercise in lesson 07)."""
    match = re.match(r"(?:ex)?0*(\d+)([a-z]?)(?:_|$)", Path(str(name)).stem.lower())
    return (int(match.group(1)), match.group(2)) if match else None


def resolve(exercise, root=None) -> str:
    """The full exercise name ("ex01_safe_softmax") for "ex01", "1", "ex01_safe_softmax", 1."""
    known = list_exercises(root)
    number = exercise_number(exercise)
    for name in known:
        if exercise_number(name) == number:
            return name
    raise LookupError(f"unknown exercise {exercise!r}; known: {', '.join(known) or 'none'}")


def short(name: str) -> str:
    """"ex01_safe_softmax" -> "ex01"."""
    return name.split("_", 1)[0]


def display_path(path) -> str:
    """``path`` as the learner sees it: relative to the course repository when inside it."""
    path = Path(path)
    root = find_root()
    try:
        return str(path.resolve().relative_to(root)) if root else str(path)
    except ValueError:
        return str(path)


def implementation_path(name: str, *, impl="exercises", path=None, root=None) -> Path:
    """Which file to grade: ``path`` (a file, or a folder holding exNN_*.py), else
    ROOT/exercises/NAME.py or ROOT/solutions/NAME.py."""
    if path is not None:
        path = Path(path)
        if path.is_dir():
            found = sorted(path.glob(f"{short(name)}_*.py")) or sorted(path.glob(f"{name}.py"))
            return found[0] if found else path / f"{name}.py"
        return path
    if impl not in ("exercises", "solutions"):
        return implementation_path(name, path=impl, root=root)  # impl given as a path
    root = course_root(root)
    return Path(root) / impl / f"{name}.py"


_load_count = 0


def load_module(path, name=None) -> types.ModuleType:
    """Execute the file at ``path`` as a brand-new module, from its current source.

    Compiled from the text on disk every call (no sys.modules entry reused, no .pyc), so a
    learner's edit is always seen, even one made within the same second as the last run.
    """
    global _load_count
    _load_count += 1
    path = Path(path)
    name = name or f"_flashlib_graded_{path.stem}_{_load_count}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    source = path.read_text(encoding="utf-8")
    code = compile(source, str(path), "exec")
    sys.modules[name] = module  # dataclasses and pickling look the module up while it runs
    try:
        exec(code, module.__dict__)
    finally:
        sys.modules.pop(name, None)
    return module


def load_grader(name: str, root=None) -> types.ModuleType:
    root = course_root(root)
    return load_module(Path(root) / "tests" / "exercises" / f"test_{name}.py",
                       f"_flashlib_grader_{name}_{_load_count + 1}")
