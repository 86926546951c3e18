"""Exercise grading: `flashlib check ex01` for learners, `flashlib grade DIR` for instructors.

How the pieces fit:

- ``solutions/exNN_topic.py`` hold the answers; ``tools/make_exercises.py`` turns them into the
  stubs in ``exercises/`` that learners edit.
- ``tests/exercises/test_exNN_topic.py`` is the grader of exercise NN: a list ``CHECKS`` of plain
  functions ``check(impl, rng)`` (impl: the learner's module, rng: a seeded NumPy generator) that
  raise ``CheckFailed`` with words a learner can act on. pytest runs them
  (``pytest tests/exercises --impl=solutions|exercises|PATH``) and so does ``check`` below,
  in-process, with the same code.
- ``check`` loads the learner's file fresh from disk on every call (compiled from source, never
  from an import cache), runs every check, prints one line per check and never raises. It runs
  them in a thread stopped after ``TIME_LIMIT_S`` (as ``grade``), so a loop that never ends is
  reported and a notebook's kernel survives it. Errors raised inside a Triton kernel are reported
  as the learner's own error at the learner's line, with a hint where the mistake is a common one.
- A file that reaches for the answer is "not accepted: write it yourself": statically
  (``borrowed``: flashlib beyond the stub's imports, solutions/, exec/importlib/sys.modules),
  once loaded (``foreign``: a public function that is flashlib's), and while it runs
  (``tripwire``: the grader's FLASHLIB_ANSWERS, flashlib's own answers to the exercise, record
  any call made from the learner's file, however the learner reached them).
- ``flashlib.classroom.grade`` (``flashlib grade DIR``) runs these checks in its own process
  against proxies of a student's functions, which run in a confined process
  (``flashlib.sandbox``), with a time limit.

Limits: ``check`` runs the learner's code in-process with the learner's rights (a teaching aid);
instructors grade untrusted work with ``flashlib grade``.
"""
import functools
import os
import re
import secrets
import sys
import traceback
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .testing import assert_close, tolerance

_ROOT_ENV = "FLASHLIB_ROOT"
_SEED_ENV = "FLASHLIB_SEED"


class CheckFailed(AssertionError):
    """A grader check failed; its message is what the learner reads."""


# ---------------------------------------------------------------------------------------------
# helpers for graders

def fail(message: str, hint: str | None = None):
    """Raise CheckFailed with ``message`` and an optional hint on its own line."""
    raise CheckFailed(message if hint is None else f"{message}\n    hint: {hint}")


def expect_close(actual, expected, *, baseline, dtype, name, hint=None, magnitude=None):
    """``flashlib.testing.assert_close`` with a hint; ``hint`` may be a callable (a diagnosis
    that runs only when the comparison fails) returning a string or None. magnitude: see
    ``flashlib.testing.tolerance``."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        fail(f"{name} has shape {actual.shape}, expected {expected.shape}", _resolve(hint))
    try:
        assert_close(actual, expected, baseline=baseline, dtype=dtype, name=name,
                     magnitude=magnitude)
    except AssertionError as e:
        bad = "" if np.all(np.isfinite(actual) | ~np.isfinite(expected)) else " (it has inf/NaN)"
        tol = tolerance(expected, baseline, dtype, magnitude=magnitude)
        fail(f"{e}{bad}\n    {where_it_differs(actual, expected, tol)}", _resolve(hint))


def _distinct(a: float, e: float) -> tuple[str, str]:
    """a and e with the fewest digits (6, 9 or 17) that tell them apart."""
    for digits in (6, 9, 17):
        shown = f"{a:.{digits}g}", f"{e:.{digits}g}"
        if shown[0] != shown[1]:
            break
    return shown


def where_it_differs(actual, expected, tol: float) -> str:
    """Which entries are off and how: how many, the rows (second-to-last axis) they sit in, and
    the worst one's index with the returned and expected values."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where(a == e, 0.0, np.abs(a - e))
    diff = np.where(np.isnan(diff), np.inf, diff)
    off = diff > tol
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    shown = _distinct(float(a[worst]), float(e[worst]))
    text = f"{int(off.sum())} of {off.size} entries off"
    if a.ndim >= 2:
        rows = np.flatnonzero(off.any(axis=-1).reshape(-1, a.shape[-2]).any(axis=0))
        listed = ", ".join(str(r) for r in rows[:8]) + (", ..." if len(rows) > 8 else "")
        text += f", in rows {listed} (of {a.shape[-2]})"
    return f"{text}; worst at index {tuple(int(i) for i in worst)}: returned {shown[0]}, expected {shown[1]}"


def _resolve(hint):
    return hint() if callable(hint) else hint


def function(impl, name: str):
    """The learner's function ``name``, or a CheckFailed saying it is missing."""
    fn = getattr(impl, name, None)
    if not callable(fn):
        fail(f"{_display(getattr(impl, '__file__', 'your file'))} defines no function {name}: "
             "keep the name and signature from the stub")
    return fn


def as_array(x, name: str):
    """np.asarray(x), or a CheckFailed naming what came back instead of an array."""
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        fail(f"{name} should be a NumPy array, got {type(x).__name__}")


def pytest_run(check_fn, impl, seed: int) -> None:
    """Run one check under pytest: pass, or fail with the learner's message (and the seed)."""
    import pytest

    result = run_one(check_fn, impl, seed)
    replay = f"(seed {seed}: replay with FLASHLIB_SEED={seed})"
    if result.status == "ok":
        return
    if result.status == "error":  # keep the traceback: it points into the code at fault
        if hasattr(result.exception, "add_note"):
            result.exception.add_note(f"{result.title}: {result.message}\n    {replay}")
        raise result.exception
    if result.status == "not done":
        pytest.fail(f"not done yet: replace the NotImplementedError in "
                    f"{_display(impl.__file__)}", pytrace=False)
    pytest.fail(f"{result.title}: {result.message}\n    {replay}", pytrace=False)


class ReadRecorder(np.lib.mixins.NDArrayOperatorsMixin):
    """An array stand-in that records which positions along ``axis`` each access reads, so a
    grader can tell one streaming pass (blocks, in order, each read once) from two passes or a
    whole-row computation. Indexing (``x[..., a:b]``, ``k[j]``) and iteration (axis 0) read what
    they select; anything else (a NumPy function or operator on it, ``np.asarray``, ``.T``,
    ``.max()``) reads everything. ``shape``, ``dtype``, ``ndim``, ``size`` and ``len`` read nothing.
    ``reads``: one sorted array of positions per access."""

    def __init__(self, array, axis):
        self._a, self._axis = np.asarray(array), axis % np.ndim(array)
        self.reads = []
        self.shape, self.dtype, self.ndim, self.size = (self._a.shape, self._a.dtype,
                                                        self._a.ndim, self._a.size)

    def _all(self):
        self.reads.append(np.arange(self._a.shape[self._axis]))

    def __len__(self):
        return len(self._a)

    def __getitem__(self, index):
        index = index._a if isinstance(index, ReadRecorder) else index
        shape = [1] * self._a.ndim
        shape[self._axis] = -1
        where = np.broadcast_to(np.arange(self._a.shape[self._axis]).reshape(shape), self._a.shape)
        self.reads.append(np.unique(where[index]))
        return self._a[index]

    def __iter__(self):
        if self._axis != 0:
            self._all()
            yield from self._a
            return
        for i in range(len(self._a)):
            self.reads.append(np.array([i]))
            yield self._a[i]

    def __array__(self, dtype=None, copy=None):
        self._all()
        return self._a if dtype is None else self._a.astype(dtype)

    @staticmethod
    def _plain(x):
        if isinstance(x, ReadRecorder):
            x._all()
            return x._a
        if isinstance(x, (tuple, list)):
            return type(x)(ReadRecorder._plain(t) for t in x)
        return x

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs, kwargs = self._plain(inputs), {k: self._plain(v) for k, v in kwargs.items()}
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return func(*self._plain(args), **{k: self._plain(v) for k, v in kwargs.items()})

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_a", "_axis", "reads"):
            raise AttributeError(name)
        self._all()
        return getattr(self._a, name)


def stream_problem(reads, n, most, what="columns") -> str | None:
    """What is not one streaming pass in ``reads`` (ReadRecorder.reads over ``n`` positions):
    an access reading more than ``most`` positions, or one going back before the block the
    previous access started at (a second pass); None when it streams."""
    start = -1
    for i, r in enumerate(reads):
        if r.size > most:
            return (f"step {i + 1} reads {r.size} of the {n} {what} at once (at most {most} "
                    "were expected)")
        if r.size and r.min() < start:
            return (f"step {i + 1} goes back to {what[:-1]} {int(r.min())} after a step that "
                    f"started at {start}: a second pass over the {what}")
        start = max(start, int(r.min()) if r.size else start)
    return None


def peak_allocation(fn, *args, **kwargs) -> int:
    """Bytes ``fn(*args, **kwargs)`` holds at its peak beyond what was allocated before the call
    (tracemalloc: Python objects and NumPy's buffers). Run it at two sizes of the input: an
    algorithm that keeps O(block) state holds the same at both, one that keeps every block (or
    every score) until the end holds more in proportion."""
    import tracemalloc

    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if started:
            tracemalloc.stop()


def runs_in_sandbox(fn) -> bool:
    """True for a proxy of a student's function that runs in ``flashlib.sandbox``'s confined
    process (``flashlib grade``): memory measured here would be the proxy's own copies, not the
    student's, so memory checks do not apply there (they do in ``flashlib check`` and pytest)."""
    return type(fn).__module__ == "flashlib.sandbox"


def memory_problem(fn, make_args, sizes, per_position, what="columns") -> str | None:
    """Why ``fn`` is not O(1) in memory along the streamed axis, or None. make_args(n): the
    arguments for an input of n positions; sizes: (small, large); per_position: the bytes one
    position of the input holds (so that a buffer of the input is its own size in bytes). A
    growth by more than a tenth of the extra input is a buffer (a correct stream grows by 0)."""
    small, large = sizes
    peaks = [peak_allocation(fn, *make_args(n)) for n in (small, large)]
    growth = peaks[1] - peaks[0]
    if growth > 0.1 * (large - small) * per_position:
        return (f"your memory grows with the number of {what}: {peaks[0] / 1024:.0f} KiB at "
                f"its peak for {small} {what}, {peaks[1] / 1024:.0f} KiB for {large}")
    return None


# ---------------------------------------------------------------------------------------------
# finding files

def find_root() -> Path | None:
    """The course repository: $FLASHLIB_ROOT, else next to flashlib (editable install or a
    clone), else the current directory or one of its parents."""
    candidates = []
    if os.environ.get(_ROOT_ENV):
        candidates.append(Path(os.environ[_ROOT_ENV]))
    candidates.append(Path(__file__).resolve().parent.parent)
    cwd = Path.cwd().resolve()
    candidates += [cwd, *cwd.parents]
    for root in candidates:
        if (root / "tests" / "exercises").is_dir():
            return root
    return None


def _root_or_none(root):
    if root is not None:
        return Path(root)
    return find_root()


_NO_ROOT = ("cannot find the course's tests/exercises/ folder: flashlib is imported from {where}, "
            "which is not a clone of the course repository. Clone it and run `pip install -e .` "
            "inside, or set FLASHLIB_ROOT=/path/to/the/clone.")


def list_exercises(root=None) -> list[str]:
    """Exercise names with a grader, e.g. ["ex00_roofline", "ex01_safe_softmax", ...]."""
    root = _root_or_none(root)
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
    root = _root_or_none(root)
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
    root = _root_or_none(root)
    return load_module(Path(root) / "tests" / "exercises" / f"test_{name}.py",
                       f"_flashlib_grader_{name}_{_load_count + 1}")


# ---------------------------------------------------------------------------------------------
# "write it yourself": files that reach for the answer are not graded

_REFUSED_MODULES = {"importlib", "builtins", "ctypes", "gc", "runpy"}
_REFUSED_NAMES = {"__import__", "exec", "eval", "__builtins__"}


def flashlib_uses(tree) -> set:
    """Dotted names of flashlib a parsed file refers to: imports and attribute chains on them."""
    import ast

    bound, uses = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "flashlib":
                    uses.add(alias.name)
                    name = alias.asname or alias.name.split(".")[0]
                    bound[name] = alias.name if alias.asname else "flashlib"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "flashlib":
            for alias in node.names:
                uses.add(f"{node.module}.{alias.name}")
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    chained = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, base = [], node
            while isinstance(base, ast.Attribute):
                parts.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                uses.add(".".join([bound[base.id], *reversed(parts)]))
                chained.add(id(base))
    for node in ast.walk(tree):   # the package itself passed around (getattr(flashlib, ...))
        if isinstance(node, ast.Name) and bound.get(node.id) == "flashlib" and \
                id(node) not in chained and isinstance(node.ctx, ast.Load):
            uses.add("flashlib (as a value)")
    return uses


def _docstrings(tree):
    import ast

    nodes = [tree, *(n for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return {id(n.body[0].value) for n in nodes if n.body and isinstance(n.body[0], ast.Expr)}


def borrowed(tree, allowed) -> str | None:
    """Why a parsed file is not accepted (it reaches for the answer), or None. allowed: the
    dotted flashlib names the exercise's stub imports (its helpers); any other use of flashlib,
    a string naming solutions/, or exec/eval/__import__/importlib/runpy/sys.modules is refused."""
    import ast

    allowed = set(allowed)
    for use in sorted(flashlib_uses(tree), key=len, reverse=True):
        if use not in allowed and not any(use.startswith(a + ".") for a in allowed
                                          if a != "flashlib"):
            return f"uses {use}"
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = {a.name.split(".")[0] for a in node.names} & _REFUSED_MODULES
        elif isinstance(node, ast.ImportFrom):
            found = {(node.module or "").split(".")[0]} & _REFUSED_MODULES
        else:
            found = set()
        if found:
            return f"imports {found.pop()}"
        if isinstance(node, ast.Name) and node.id in _REFUSED_NAMES:
            return f"uses {node.id}"
        if isinstance(node, ast.Attribute) and node.attr == "modules" and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            return "uses sys.modules"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docs and ("solutions/" in node.value or "solutions\\" in node.value
                                          or node.value == "solutions"):
            return "names solutions/"
    return None


def allowed_flashlib(grader, name, root) -> set:
    """What a learner's file may use of flashlib: the grader's FLASHLIB_ALLOWED (the stub's
    imports), else what the reference answer or the stub imports."""
    import ast

    declared = getattr(grader, "FLASHLIB_ALLOWED", None)
    if declared is not None:
        return set(declared)
    for folder in ("solutions", "exercises"):
        file = Path(root) / folder / f"{name}.py"
        if file.is_file():
            return flashlib_uses(ast.parse(file.read_text(encoding="utf-8")))
    return set()


def _origin(obj):
    """The source file a function (or a Triton kernel's function) was defined in, or None."""
    code = getattr(getattr(obj, "fn", obj), "__code__", None)
    return Path(code.co_filename).resolve() if code is not None else None


def foreign(module, allowed, root) -> str | None:
    """Why a loaded file is not accepted: one of its public functions is flashlib's (beyond the
    ``allowed`` helpers) or comes from solutions/; else None. Catches what hides from ``borrowed``."""
    package = Path(__file__).resolve().parent
    solutions = (Path(root) / "solutions").resolve()
    own = Path(module.__file__).resolve()
    for attr, obj in vars(module).items():
        where = None if attr.startswith("_") or isinstance(obj, types.ModuleType) else _origin(obj)
        if where is None or where == own:
            continue
        fn = getattr(obj, "fn", obj)
        dotted = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', attr)}"
        if where.is_relative_to(solutions):
            return f"{attr} comes from solutions/{where.name}"
        if where.is_relative_to(package) and dotted not in allowed:
            return f"{attr} is flashlib's {dotted}"
    return None


NOT_ACCEPTED = "not accepted: write it yourself ({why})"


# A runtime tripwire for what ``borrowed`` and ``foreign`` cannot see (a name built from strings,
# pkgutil.resolve_name, getattr on a module found at run time): while a learner's function runs,
# flashlib's own answers to the exercise (the grader's FLASHLIB_ANSWERS, dotted names) are
# replaced by wrappers that record a call made with the graded file on the stack.
_ACTIVE = []       # (graded file, calls recorded) for each tripwire set


@functools.lru_cache(maxsize=4096)
def _resolved(filename) -> str:
    return str(Path(filename).resolve())


def _on_stack(file) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if _resolved(frame.f_code.co_filename) == file:
            return True
        frame = frame.f_back
    return False


def _recording(original, dotted):
    def recorder(*args, **kwargs):
        for file, calls in list(_ACTIVE):
            if _on_stack(file):
                calls.append(dotted)
        return original(*args, **kwargs)

    recorder.__name__, recorder.__doc__ = original.__name__, original.__doc__
    recorder._flashlib_tripwire = True
    return recorder


class tripwire:
    """``with tripwire(names, path) as calls:`` the functions ``names`` ("flashlib.softmax.
    safe_softmax", ...) record in ``calls`` each call made from the file ``path`` (on the stack)."""

    def __init__(self, names, path):
        self.names, self.path, self.calls, self._undo = tuple(names or ()), path, [], []

    def __enter__(self):
        import importlib

        if not self.names or self.path is None:
            return self.calls
        for dotted in self.names:
            module_name, attr = dotted.rsplit(".", 1)
            module = importlib.import_module(module_name)
            original = getattr(module, attr)
            if not getattr(original, "_flashlib_tripwire", False):
                setattr(module, attr, _recording(original, dotted))
                self._undo.append((module, attr, original))
        self._entry = (str(Path(self.path).resolve()), self.calls)
        _ACTIVE.append(self._entry)
        return self.calls

    def __exit__(self, *exc):
        if self.names and self.path is not None:
            _ACTIVE.remove(self._entry)
        for module, attr, original in reversed(self._undo):
            setattr(module, attr, original)
        return False


def answers(check_fn) -> tuple:
    """flashlib's own answers to the exercise a check belongs to: its grader's FLASHLIB_ANSWERS."""
    return tuple(getattr(check_fn, "__globals__", {}).get("FLASHLIB_ANSWERS", ()))


def _tripped(calls) -> str:
    return NOT_ACCEPTED.format(why=f"calls {calls[0]}, flashlib's own answer")


# ---------------------------------------------------------------------------------------------
# running checks

@dataclass
class CheckResult:
    title: str                      # what the check tests, from its docstring
    status: str                     # "ok" | "failed" | "not done" | "error" | "not accepted"
    message: str = ""
    exception: BaseException | None = field(default=None, repr=False)


@dataclass
class Report:
    name: str                       # "ex01_safe_softmax"
    path: Path | None               # the graded file
    seed: int
    total: int                      # number of checks in the grader
    results: list = field(default_factory=list)
    problem: str | None = None      # why nothing could be graded (missing file, syntax error)
    status: str = "failed"          # "passed", "failed", "not done", "error", "missing", "timeout",
    #                                 "not accepted" (the file uses flashlib's answer or solutions/)

    @property
    def passed(self) -> int:
        return sum(r.status == "ok" for r in self.results)


def default_seed() -> int:
    """$FLASHLIB_SEED if set (to replay a failure), else a fresh one."""
    env = os.environ.get(_SEED_ENV, "").strip()
    return int(env) if env else secrets.randbelow(1_000_000)


def check_title(check_fn) -> str:
    doc = (check_fn.__doc__ or check_fn.__name__).strip()
    return doc.splitlines()[0].rstrip(".")


def check_id(check_fn) -> str:
    """pytest id for a check function: its name without "check_"."""
    return check_fn.__name__.removeprefix("check_")


def _display(path) -> str:
    path = Path(path)
    root = find_root()
    try:
        return str(path.resolve().relative_to(root)) if root else str(path)
    except ValueError:
        return str(path)


def _chain(exc) -> list:
    """``exc`` and the exceptions it was raised from, outermost first."""
    chain = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return chain


def _unwrap(exc):
    """The learner's own error inside Triton's interpreter wrappers: InterpreterError wraps it
    once per kernel or @triton.jit call level, saying only InterpreterError('...')."""
    while (type(exc).__name__ == "InterpreterError" and type(exc).__module__.startswith("triton")
           and exc.__cause__ is not None):
        exc = exc.__cause__
    return exc


def _learner_frame(exc, path):
    """The innermost traceback frame in the graded file, searching the chained causes too (an
    error inside a kernel surfaces at the launcher, its cause holds the kernel's line)."""
    if path is None:
        return None
    path = Path(path).resolve()
    for e in reversed(_chain(exc)):
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path]
        if frames:
            return frames[-1]
    return None


def _where(exc, path) -> str:
    """" (your file, line 12)" if the exception came from the graded file."""
    frame = _learner_frame(exc, path)
    return f" ({_display(path)}, line {frame.lineno})" if frame is not None else ""


_PY_MATH_CALL = re.compile(r"(?<![\w.])(math|np|numpy)\.\w+\s*\(")


def _error_hint(exc, path=None) -> str:
    """A hint for an error raised by the learner's code, or ""."""
    in_triton = any(type(e).__module__.startswith("triton") for e in _chain(exc))
    frame = _learner_frame(exc, path)
    exc = _unwrap(exc)
    text = str(exc)
    line = (frame.line or "") if frame is not None else ""
    compiled = type(exc).__name__ == "CompilationError"   # on a GPU: the message quotes the line
    if in_triton and (_PY_MATH_CALL.search(line) or (compiled and _PY_MATH_CALL.search(text))
                      or "only 0-dimensional arrays can be converted to Python scalars" in text):
        hint = ("inside a @triton.jit kernel use Triton's functions, which work on whole blocks: "
                "tl.exp, tl.math.exp2, tl.log, tl.maximum; Python's math and NumPy take plain "
                "numbers")
    elif "must be same dtype" in text or "must have the same dtype" in text:
        hint = ("tl.dot takes two operands of one dtype: cast the float32 one to the other's, "
                "e.g. tl.dot(p.to(v.dtype), v, acc, ...)")
    elif "make_shape_compatible" in text or "incompatible dimensions" in text:
        hint = ("blocks of different shapes met inside the kernel: return your values in the "
                "order the docstring gives (the kernel unpacks them in that order), and index a "
                "per-row (BM,) vector as x[:, None] to combine it with a (BM, BN) block")
    elif "values to unpack" in text:
        hint = "return exactly the values the docstring lists, in its order"
    elif isinstance(exc, ValueError) and "broadcast" in text:
        hint = ("shapes do not line up: reduce with keepdims=True, or index with [..., None], "
                "so a per-row value broadcasts against the row")
    elif isinstance(exc, TypeError) and "argument" in text:
        hint = "keep the function's signature exactly as in the stub"
    else:
        return ""
    return f"\n    hint: {hint}"


def _error_message(exc, path) -> str:
    """"ValueError: ... (your file, line 12)" and a hint, for an exception from the learner's code."""
    root = _unwrap(exc)
    return f"{type(root).__name__}: {root}{_where(exc, path)}{_error_hint(exc, path)}"


def run_one(check_fn, impl, seed: int) -> CheckResult:
    """Run one check on a loaded implementation; never raises (except KeyboardInterrupt)."""
    title = check_title(check_fn)
    path = getattr(impl, "__file__", None)
    calls = []
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"), \
                tripwire(answers(check_fn), path) as calls:
            # overflow warnings from a wrong answer are expected; the report says what matters
            warnings.simplefilter("ignore", RuntimeWarning)
            check_fn(impl, np.random.default_rng(seed))
    except CheckFailed as e:
        if calls:
            return CheckResult(title, "not accepted", _tripped(calls), e)
        return CheckResult(title, "failed", str(e), e)
    except NotImplementedError as e:
        return CheckResult(title, "not done", str(e), e)
    except RecursionError as e:
        return CheckResult(title, "error", f"RecursionError{_where(e, path)}", e)
    except Exception as e:  # the learner's code raised: report it, don't crash the grader
        if calls:
            return CheckResult(title, "not accepted", _tripped(calls), e)
        return CheckResult(title, "error", _error_message(e, path), e)
    if calls:
        return CheckResult(title, "not accepted", _tripped(calls))
    return CheckResult(title, "ok")


def run_checks(exercise, *, impl="exercises", path=None, seed=None, root=None) -> Report:
    """Grade one exercise in-process; returns a Report (never raises for the learner's faults)."""
    seed = default_seed() if seed is None else int(seed)
    root = _root_or_none(root)
    if root is None:
        return Report(str(exercise), None, seed, 0, problem=_NO_ROOT.format(
            where=Path(__file__).resolve().parent), status="error")
    try:
        name = resolve(exercise, root)
    except LookupError as e:
        return Report(str(exercise), None, seed, 0, problem=str(e), status="error")
    grader = load_grader(name, root)
    checks = list(grader.CHECKS)
    file = implementation_path(name, impl=impl, path=path, root=root)
    report = Report(name, file, seed, len(checks))
    if not file.is_file():
        where = "run `python tools/make_exercises.py` to regenerate it, or restore it from git" \
            if impl == "exercises" and path is None else "check the path"
        report.problem, report.status = f"{_display(file)} is missing: {where}", "missing"
        return report
    allowed = allowed_flashlib(grader, name, root)
    try:
        import ast

        why = borrowed(ast.parse(file.read_text(encoding="utf-8"), str(file)), allowed)
    except (SyntaxError, ValueError):
        why = None    # reported below, as load_module meets it
    if why is not None:
        report.problem, report.status = NOT_ACCEPTED.format(why=why), "not accepted"
        return report
    try:
        with tripwire(getattr(grader, "FLASHLIB_ANSWERS", ()), file) as calls:
            module = load_module(file)   # an answer taken at import is still the recorder
    except NotImplementedError:
        report.status = "not done"
        return report
    except SyntaxError as e:
        report.problem = (f"your file does not parse: SyntaxError: {e.msg} "
                          f"({_display(file)}, line {e.lineno})")
        report.status = "error"
        return report
    except Exception as e:
        report.problem = f"your file fails on import: {type(e).__name__}: {e}{_where(e, file)}"
        report.status = "error"
        return report
    why = foreign(module, allowed, root)
    if why is None and calls:
        why = f"calls {calls[0]}, flashlib's own answer"
    if why is not None:
        report.problem, report.status = NOT_ACCEPTED.format(why=why), "not accepted"
        return report
    for c in checks:
        report.results.append(run_one(c, module, seed))
        if report.results[-1].status == "not accepted":
            report.problem, report.status = report.results[-1].message, "not accepted"
            return report
    statuses = {r.status for r in report.results}
    if statuses == {"ok"}:
        report.status = "passed"
    elif "not done" in statuses:
        report.status = "not done"
    elif "error" in statuses:
        report.status = "error"
    return report


def format_report(report: Report) -> str:
    """The friendly text report: one line per check, a hint under each failure."""
    sn = short(report.name)
    where = _display(report.path) if report.path is not None else ""
    if report.status == "not done" and all(r.status == "not done" for r in report.results):
        return (f"{sn} not done yet: open {where} and replace the NotImplementedError "
                "with your code (the docstring is the spec)")
    if report.problem is not None:
        return f"{sn}: {report.problem}"
    lines = [f"{report.name} ({where}, seed {report.seed})"]
    last_hint = None
    for r in report.results:
        tag = {"ok": "ok  ", "failed": "FAIL", "error": "ERR ",
               "not done": "todo"}.get(r.status, "----")
        lines.append(f"  {tag}  {r.title}")
        for line in r.message.splitlines() if r.status != "ok" else []:
            line = line.strip()
            if line.startswith("hint:"):  # say a hint once, not under every failing check
                line, last_hint = ("hint: as above" if line == last_hint else line), line
            if line:
                lines.append("        " + line)
    if report.status == "passed":
        lines.append(f"{sn} passed: all {report.total} checks. Well done!")
    else:
        lines.append(f"{sn}: {report.passed} of {report.total} checks passed. Fix the first "
                     f"failure, then check again (same inputs: FLASHLIB_SEED={report.seed}).")
    return "\n".join(lines)


TIME_LIMIT_S = 60.0   # per exercise, as `flashlib grade` (classroom.grade's default timeout)


class _TimeUp(BaseException):
    """Raised inside a check's thread when its time is up. A BaseException, so that neither an
    ``except Exception`` in the learner's code nor Triton's interpreter catches it."""


def _stop(thread) -> None:
    """Raise _TimeUp in ``thread`` at its next Python line (CPython's async exception)."""
    import ctypes

    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc(ctypes.c_ulong(thread.ident), ctypes.py_object(_TimeUp))


def _line_running(thread, file) -> int | None:
    """The line of ``file`` that ``thread`` is running (innermost), or None."""
    frame = sys._current_frames().get(thread.ident)
    file = Path(file).resolve() if file is not None else None
    while frame is not None and file is not None:
        if Path(frame.f_code.co_filename).resolve() == file:
            return frame.f_lineno
        frame = frame.f_back
    return None


def _run_checks_in_time(exercise, *, impl, path, seed, timeout) -> Report:
    """``run_checks`` in a thread, stopped after ``timeout`` seconds: a notebook's kernel (and
    its variables) survive a learner's loop that never ends, with no process to start."""
    import threading

    box = {}

    def work():
        try:
            box["report"] = run_checks(exercise, impl=impl, path=path, seed=seed)
        except _TimeUp:
            pass
        except BaseException as e:  # noqa: B036  re-raised in the caller's thread
            box["error"] = e

    worker = threading.Thread(target=work, name="flashlib-check", daemon=True)
    worker.start()
    try:
        worker.join(timeout)
    except KeyboardInterrupt:   # a notebook's stop button stops the check too
        _stop(worker)
        raise
    if "error" in box:
        raise box["error"]
    if "report" in box:
        return box["report"]
    name = resolve(exercise)
    file = implementation_path(name, impl=impl, path=path)
    line = _line_running(worker, file)
    _stop(worker)
    worker.join(5.0)
    where = f", line {line}" if line is not None else ""
    problem = (f"stopped after {timeout:g} s (the time limit `flashlib grade` gives each "
               f"exercise): your code was still running ({_display(file)}{where}). Look for a loop "
               "that never ends: a while loop whose condition never turns false, or a loop "
               "variable that is never advanced.")
    if worker.is_alive():
        problem += " It is still running in the background: restart the kernel (or Python)."
    return Report(name, file, seed, 0, problem=problem, status="timeout")


def check(exercise, *, impl="exercises", path=None, seed=None, timeout=None) -> bool:
    """Grade one exercise: print a short report, return True only if every check passes.

    exercise: "ex01", "1", 1 or "ex01_safe_softmax". impl: "exercises" (your work) or
    "solutions". path: a file (or folder of exNN_*.py files) to grade instead. timeout: seconds
    before the check is stopped and reported (None: TIME_LIMIT_S, as `flashlib grade`). Never
    raises: an unsolved stub, a syntax error, an exception or a loop that never ends in your
    code is reported, not raised.
    """
    seed = default_seed() if seed is None else int(seed)
    timeout = TIME_LIMIT_S if timeout is None else float(timeout)
    try:
        report = _run_checks_in_time(exercise, impl=impl, path=path, seed=seed, timeout=timeout)
    except Exception as e:  # a broken grader or install: still never raise into a lesson
        print(f"{exercise}: could not run the grader: {type(e).__name__}: {e}")
        return False
    print(format_report(report))
    return report.status == "passed"


def check_all(*, impl="exercises", path=None, seed=None, timeout=None) -> bool:
    """``check`` every exercise (each with its own time limit); True if all pass."""
    names = list_exercises()
    if not names:
        print(_NO_ROOT.format(where=Path(__file__).resolve().parent))
        return False
    seed = default_seed() if seed is None else seed
    results = []
    for name in names:
        results.append(check(name, impl=impl, path=path, seed=seed, timeout=timeout))
        print()
    print(f"{sum(results)} of {len(results)} exercises passed")
    return all(results)
