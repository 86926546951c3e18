"""Exercise grading: `flashlib check ex01` for learners, `flashlib grade DIR` for instructors.

This module runs the checks and reports: ``check`` and ``check_all`` (what lessons call),
``run_checks``, ``run_one`` and ``format_report``. How the pieces fit:

- ``solutions/exNN_topic.py`` hold the answers; ``tools/make_exercises.py`` turns them into the
  stubs in ``exercises/`` that learners edit.
- ``tests/exercises/test_exNN_topic.py`` is the grader of exercise NN: a list ``CHECKS`` of plain
  functions ``check(impl, rng)`` (impl: the learner's module, rng: a seeded NumPy generator) that
  raise ``CheckFailed`` with words a learner can act on, written with ``flashlib.checks``. pytest
  runs them (``pytest tests/exercises --impl=solutions|exercises|PATH``) and so does ``check``
  below, in-process, with the same code.
- ``flashlib.course`` finds the course repository, resolves exercise names ("ex01") and loads
  files: ``check`` loads the learner's file fresh from disk on every call (compiled from source,
  never from an import cache), runs every check, prints one line per check and never raises. It
  runs them in a thread stopped after ``TIME_LIMIT_S`` (as ``grade``), so a loop that never ends
  is reported and a notebook's kernel survives it. Errors raised inside a Triton kernel are
  reported as the learner's own error at the learner's line, with a hint where the mistake is a
  common one.
- A file that reaches for the answer is "not accepted: write it yourself" (``flashlib.integrity``):
  statically (``borrowed``: flashlib beyond the stub's imports, solutions/, exec/importlib/
  sys.modules), once loaded (``foreign``: a public function that is flashlib's), and while it runs
  (``tripwire``: the grader's FLASHLIB_ANSWERS, flashlib's own answers to the exercise, record
  any call made from the learner's file, however the learner reached them).
- ``flashlib.classroom.grade`` (``flashlib grade DIR``) runs these checks in its own process
  against proxies of a student's functions, which run in a confined process
  (``flashlib.sandbox``), with a time limit.

Limits: ``check`` runs the learner's code in-process with the learner's rights (a teaching aid);
instructors grade untrusted work with ``flashlib grade``.
"""
import os
import re
import secrets
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .checks import CheckFailed
from .course import (course_root, display_path, implementation_path, list_exercises, load_grader,
                     load_module, no_root_message, resolve, short)
from .integrity import NOT_ACCEPTED, allowed_flashlib, answers, borrowed, foreign, tripped, tripwire

_SEED_ENV = "FLASHLIB_SEED"


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
    return f" ({display_path(path)}, line {frame.lineno})" if frame is not None else ""


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
            return CheckResult(title, "not accepted", tripped(calls), e)
        return CheckResult(title, "failed", str(e), e)
    except NotImplementedError as e:
        return CheckResult(title, "not done", str(e), e)
    except RecursionError as e:
        return CheckResult(title, "error", f"RecursionError{_where(e, path)}", e)
    except Exception as e:  # the learner's code raised: report it, don't crash the grader
        if calls:
            return CheckResult(title, "not accepted", tripped(calls), e)
        return CheckResult(title, "error", _error_message(e, path), e)
    if calls:
        return CheckResult(title, "not accepted", tripped(calls))
    return CheckResult(title, "ok")


def run_checks(exercise, *, impl="exercises", path=None, seed=None, root=None) -> Report:
    """Grade one exercise in-process; returns a Report (never raises for the learner's faults)."""
    seed = default_seed() if seed is None else int(seed)
    root = course_root(root)
    if root is None:
        return Report(str(exercise), None, seed, 0, problem=no_root_message(),
                      status="error")
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
        report.problem, report.status = f"{display_path(file)} is missing: {where}", "missing"
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
                          f"({display_path(file)}, line {e.lineno})")
        report.status = "error"
        return report
    except Exception as e:
        report.problem = f"your file fails on import: {type(e).__name__}: {e}{_where(e, file)}"
        report.status = "error"
        return report
    why = foreign(module, allowed, root)
    if why is not None or calls:
        report.problem = NOT_ACCEPTED.format(why=why) if why is not None else tripped(calls)
        report.status = "not accepted"
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
    where = display_path(report.path) if report.path is not None else ""
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
               f"exercise): your code was still running ({display_path(file)}{where}). Look for "
               "a loop that never ends: a while loop whose condition never turns false, or a loop "
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
        print(no_root_message())
        return False
    seed = default_seed() if seed is None else seed
    results = []
    for name in names:
        results.append(check(name, impl=impl, path=path, seed=seed, timeout=timeout))
        print()
    print(f"{sum(results)} of {len(results)} exercises passed")
    return all(results)
