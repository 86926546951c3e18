"""Exercise grading: the checks and the report behind `flashlib check` and `flashlib grade`.

This module runs a grader's checks on one file and reports: ``run_checks``, ``run_one`` and
``format_report``. How the pieces fit:

- ``solutions/exNN_topic.py`` hold the answers; ``tools/make_exercises.py`` turns them into the
  stubs in ``exercises/`` that learners edit.
- ``tests/exercises/test_exNN_topic.py`` is the grader of exercise NN: a list ``CHECKS`` of plain
  functions ``check(impl, rng)`` (impl: the learner's module, rng: a seeded NumPy generator) that
  raise ``CheckFailed`` with words a learner can act on, written with ``flashlib.course.checks``; the
  Triton exercises' graders add ``GPU_CHECKS``, run only on a GPU: the learner's kernel compiled
  once at a real size. pytest runs them (``pytest tests/exercises --impl=solutions|exercises|PATH``)
  and so does ``run_checks`` below, with the same code.
- ``flashlib.course`` finds the course repository, resolves exercise names ("ex01") and loads
  files: ``run_checks`` loads the learner's file fresh from disk on every call (compiled from
  source, never from an import cache) and runs every check. Errors raised inside a Triton kernel
  are reported as the learner's own error at the learner's line, with a hint where the mistake is
  a common one.
- A file that reaches for the answer is "not accepted: write it yourself" (``flashlib.course.integrity``):
  statically (``borrowed``: flashlib beyond the stub's imports, solutions/, exec/importlib/
  sys.modules), once loaded (``foreign``: a public function that is flashlib's), and while it runs
  (``tripwire``: the grader's FLASHLIB_ANSWERS, flashlib's own answers to the exercise, record
  any call made from the learner's file, however the learner reached them).
- ``flashlib.course.self_check`` (``flashlib check ex01``, the lessons' check cells) runs these checks
  within a time limit, in a thread or a child process, and prints the report;
  ``flashlib.course.classroom.grade`` (``flashlib grade DIR``) runs them in its own process against
  proxies of a student's functions, which run in a confined process (``flashlib.course.sandbox``).
"""
import os
import re
import secrets
import textwrap
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .checks import CheckFailed
from .files import (course_root, display_path, implementation_path, load_grader,
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
    where: str = ""                 # "" (the checks) or "compiled for <GPU>" (the GPU_CHECKS)

    @property
    def passed(self) -> int:
        return sum(r.status == "ok" for r in self.results)


def _gpu_label() -> str:
    import torch

    return (f"compiled for the GPU ({torch.cuda.get_device_name()})" if torch.cuda.is_available()
            else "compiled for the GPU")


def default_seed() -> int:
    """$FLASHLIB_SEED if set (to replay a failure), else a fresh one."""
    env = os.environ.get(_SEED_ENV, "").strip()
    return int(env) if env else secrets.randbelow(1_000_000)


def check_title(check_fn) -> str:
    """What a check tests: the first paragraph of its docstring on one line (a title that wraps
    in the source is not cut mid-sentence), or its name."""
    doc = (check_fn.__doc__ or check_fn.__name__).strip()
    return " ".join(doc.split("\n\n")[0].split()).rstrip(".")


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
    elif isinstance(exc, ImportError) and "gluon" in text and not _has_gluon_hopper():
        import triton
        hint = (f"this exercise is written in Gluon, whose Hopper API (mbarrier, tma) this Triton "
                f"({triton.__version__}) lacks: install a newer Triton (the course's GPU runs use 3.6)")
    else:
        return ""
    return f"\n    hint: {hint}"


def _has_gluon_hopper() -> bool:
    try:
        from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma  # noqa: F401
    except ImportError:
        return False
    return True


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
        with (warnings.catch_warnings(), np.errstate(all="ignore"),
              tripwire(answers(check_fn), path) as calls):
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


def run_checks(exercise, *, impl="exercises", path=None, seed=None, root=None, gpu=False,
               progress=None) -> Report:
    """Grade one exercise in-process; returns a Report (never raises for the learner's faults).

    gpu: run the grader's ``GPU_CHECKS`` (the learner's kernel compiled for the GPU, at a real
    size) instead of its ``CHECKS``. progress: called with each check's title as it starts."""
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
    checks = list(getattr(grader, "GPU_CHECKS", ()) if gpu else grader.CHECKS)
    file = implementation_path(name, impl=impl, path=path, root=root)
    report = Report(name, file, seed, len(checks), where=_gpu_label() if gpu else "")
    if not file.is_file():
        where = ("run `python tools/make_exercises.py` to regenerate it, or restore it from git"
                 if impl == "exercises" and path is None else "check the path")
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
        report.problem = f"your file fails on import: {_error_message(e, file)}"
        report.status = "error"
        return report
    why = foreign(module, allowed, root)
    if why is not None or calls:
        report.problem = NOT_ACCEPTED.format(why=why) if why is not None else tripped(calls)
        report.status = "not accepted"
        return report
    for c in checks:
        if progress is not None:
            progress(check_title(c))
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


def check_id(check_fn) -> str:
    """pytest id for a check function: its name without "check_"."""
    return check_fn.__name__.removeprefix("check_")


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
                    f"{display_path(impl.__file__)}", pytrace=False)
    pytest.fail(f"{result.title}: {result.message}\n    {replay}", pytrace=False)


def format_report(report: Report) -> str:
    """The friendly text report: one line per check, a hint under each failure."""
    sn = short(report.name)
    where = display_path(report.path) if report.path is not None else ""
    if report.status == "not done" and all(r.status == "not done" for r in report.results):
        return (f"{sn} not done yet: open {where} and replace the NotImplementedError "
                "with your code (the docstring is the spec)")
    if report.problem is not None:
        return f"{sn}: {report.problem}"
    stage = f", {report.where}" if report.where else ""
    lines = [f"{report.name}{stage} ({where}, seed {report.seed})"]
    last_hint = None
    for r in report.results:
        tag = {"ok": "ok  ", "failed": "FAIL", "error": "ERR ",
               "not done": "todo"}.get(r.status, "----")
        lines.append(textwrap.fill(r.title, width=100, initial_indent=f"  {tag}  ",
                                   subsequent_indent=" " * 8))
        for line in r.message.splitlines() if r.status != "ok" else []:
            line = line.strip()
            if line.startswith("hint:"):  # say a hint once, not under every failing check
                line, last_hint = ("hint: as above" if line == last_hint else line), line
            if line:
                lines.append("        " + line)
    if report.status == "passed":
        lines.append(f"{sn} passed{stage}: all {report.total} checks. Well done!")
    else:
        lines.append(f"{sn}: {report.passed} of {report.total} checks passed. Fix the first "
                     f"failure, then check again (same inputs: FLASHLIB_SEED={report.seed}).")
    return "\n".join(lines)
