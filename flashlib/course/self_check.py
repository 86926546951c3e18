"""`flashlib check ex07`: a learner grades their own exercise, with hints, within a time limit.

The checks and the report are ``flashlib.course.grading``'s; this module decides where they run and
stops them when their time is up (``TIME_LIMIT_S``, as `flashlib grade` gives each exercise):

- **Without a GPU** they run in a thread of this process, through Triton's interpreter like every
  kernel here. A learner's loop that never ends is stopped at its next Python line, and a
  notebook's kernel (with its variables) survives it.
- **With a GPU** they run in a child process with Triton's interpreter on and the GPU hidden,
  exactly as on a CPU and as `flashlib grade` runs them. A grader tries the learner's code in
  many shapes, dtypes and options; compiled for the GPU each variant costs seconds (an H100 ran
  out of ex07's 60 s compiling right answers), through the interpreter all of them take
  seconds, and the hints are the CPU's by construction. Then, for the exercises whose grader
  has ``GPU_CHECKS`` (the Triton kernels), a second child compiles the learner's kernel for the
  GPU and runs it once at a real size, which shows what the interpreter cannot: a compile
  error, a load past the end that the interpreter forgave, the real dtype's rounding.
  A child is killed when its time is up, however it is stuck (in a compile, in a kernel that
  never ends on the GPU).
- **A timeout says what was running**: which check, and whether the time went to compiling a
  kernel, to a line of the learner's file, or to the grader's own code. Only a learner's line
  gets the endless-loop hint.

Limits: the learner's code runs with the learner's rights (a teaching aid); instructors grade
untrusted work with `flashlib grade`. On a GPU each check pays a child's start (about 2 s,
mostly `import torch`).
"""
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .. import runtime
from .files import (course_root, display_path, implementation_path, list_exercises, load_grader,
                    no_root_message, resolve, short)
from .grading import Report, default_seed, format_report, run_checks

TIME_LIMIT_S = 60.0   # per exercise and stage, as `flashlib grade` (classroom.grade's default)
_CHILD_START_S = 30.0  # a child's own start (import torch, CUDA) on top of its time limit
# frames from these parts of Triton mean the time went to compiling, not to running
_COMPILER_FILES = (os.sep + os.path.join("triton", "compiler") + os.sep,
                   os.sep + os.path.join("triton", "backends") + os.sep,
                   os.sep + os.path.join("triton", "runtime", "build.py"))


class _TimeUp(BaseException):
    """Raised inside a check's thread when its time is up. A BaseException, so that neither an
    ``except Exception`` in the learner's code nor Triton's interpreter catches it."""


def _stop(thread) -> None:
    """Raise _TimeUp in ``thread`` at its next Python line (CPython's async exception)."""
    import ctypes

    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc(ctypes.c_ulong(thread.ident), ctypes.py_object(_TimeUp))


def what_was_running(frame, file) -> tuple[str, bool]:
    """What a thread stopped at ``frame`` was doing, in words, and whether it was the learner's
    own code (the only case where an endless loop is the likely cause)."""
    file = Path(file).resolve() if file is not None else None
    compiling = learner_line = None
    while frame is not None:
        name = frame.f_code.co_filename
        if compiling is None and any(part in name for part in _COMPILER_FILES):
            compiling = frame
        if learner_line is None and file is not None and Path(name).resolve() == file:
            learner_line = frame.f_lineno
        frame = frame.f_back
    if compiling is not None:
        return ("Triton was compiling a kernel for the GPU (a fresh machine's first compiles "
                "take seconds each); not a fault of your code"), False
    if learner_line is not None:
        return f"your code was still running ({display_path(file)}, line {learner_line})", True
    return "the grader's own code was running (your file was not on the stack)", False


def _timeout_problem(timeout, title, doing, learners) -> str:
    during = f" in the check \"{title}\"" if title else ""
    problem = f"stopped after {timeout:g} s{during} (the time limit of `flashlib grade`): {doing}."
    if learners:
        problem += (" Look for a loop that never ends: a while loop whose condition never turns "
                    "false, or a loop variable that is never advanced.")
    return problem


def _run_checks_in_time(exercise, *, impl, path, seed, timeout, gpu=False, root=None,
                        in_child=False, progress=None) -> Report:
    """``run_checks`` in a thread, stopped after ``timeout`` seconds. In this process (no GPU) the
    thread is stopped at its next Python line; in a child (``in_child``) the report is written
    and the child leaves, however the thread is stuck. progress: called with each check's title."""
    box = {"title": None}

    def started(title):
        box["title"] = title
        if progress is not None:
            progress(title)

    def work():
        try:
            box["report"] = run_checks(exercise, impl=impl, path=path, seed=seed, root=root,
                                       gpu=gpu, progress=started)
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
    name = resolve(exercise, root)
    file = implementation_path(name, impl=impl, path=path, root=root)
    doing, learners = what_was_running(sys._current_frames().get(worker.ident), file)
    problem = _timeout_problem(timeout, box["title"], doing, learners)
    if not in_child:
        _stop(worker)
        worker.join(5.0)
        if worker.is_alive():
            problem += " It is still running in the background: restart the kernel (or Python)."
    return Report(name, file, seed, 0, problem=problem, status="timeout")


# ---------------------------------------------------------------------------------------------
# a child process per stage on a GPU machine

def _child_env(gpu: bool) -> dict:
    """The child's environment: flashlib importable from where this one was (a course run from
    its folder without `pip install`); the interpreter on and the GPU hidden, unless ``gpu``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    if gpu:
        env.pop("TRITON_INTERPRET", None)
        env["FLASHLIB_AUTOTUNE"] = "0"   # one block config: one compile per kernel
    else:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return env


def _echo(stream) -> None:
    """Print what the child prints (the learner's own prints among it), as it comes."""
    for line in iter(stream.readline, b""):
        print(line.decode(errors="replace"), end="", flush=True)


def run_checks_in_child(exercise, *, impl="exercises", path=None, seed, timeout, gpu=False,
                        root=None, start_allowance=_CHILD_START_S) -> Report:
    """``run_checks`` in a child process (see the module's docstring), stopped after ``timeout``
    seconds of checking; the child's start is not counted. A child that cannot even stop itself
    (its Python stuck inside a call that never lets go) is killed ``start_allowance`` s later."""
    root = course_root(root)
    with tempfile.TemporaryDirectory(prefix="flashlib-check-") as tmp:
        result, title = Path(tmp) / "report.pickle", Path(tmp) / "running"
        args = dict(exercise=str(exercise), impl=str(impl), path=None if path is None else str(path),
                    seed=seed, timeout=timeout, gpu=gpu, root=str(root), result=str(result),
                    title=str(title))
        proc = subprocess.Popen([sys.executable, "-m", "flashlib.course.self_check", json.dumps(args)],
                                env=_child_env(gpu), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        echo = threading.Thread(target=_echo, args=(proc.stdout,), daemon=True)
        echo.start()
        try:
            proc.wait(timeout + start_allowance)
        except subprocess.TimeoutExpired:
            pass
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            echo.join(5.0)
        if result.is_file():
            with open(result, "rb") as f:
                return pickle.load(f)
        name = resolve(exercise, root)
        file = implementation_path(name, impl=impl, path=path, root=root)
        running = title.read_text() if title.is_file() else None
        if proc.returncode == -signal.SIGKILL:
            doing = ("it did not come back to Python in time (a kernel compiling or running on "
                     "the GPU, or another long call into compiled code)")
            problem = _timeout_problem(timeout, running, doing, False)
            return Report(name, file, seed, 0, problem=problem, status="timeout")
        problem = (f"the checks' process ended with exit code {proc.returncode} before reporting"
                   + (f", in the check \"{running}\"" if running else "")
                   + ": its output is above")
        return Report(name, file, seed, 0, problem=problem, status="error")


def _child_main(args) -> None:
    """In the child: grade, write the report (without exceptions, which may not pickle), leave.
    The running check's title goes to a file, for the parent to name if it must kill us."""
    report = None
    try:
        report = _run_checks_in_time(args["exercise"], impl=args["impl"], path=args["path"],
                                     seed=args["seed"], timeout=args["timeout"], gpu=args["gpu"],
                                     root=args["root"], in_child=True,
                                     progress=Path(args["title"]).write_text)
    finally:
        if report is not None:
            for r in report.results:
                r.exception = None
            with open(args["result"] + ".part", "wb") as f:
                pickle.dump(report, f)
            os.replace(args["result"] + ".part", args["result"])
        sys.stdout.flush()
        os._exit(0 if report is not None else 1)   # a stuck check thread must not hold the exit


# ---------------------------------------------------------------------------------------------
# what lessons and the `flashlib check` command call

def _grade(exercise, *, impl, path, seed, timeout) -> bool:
    """Print the reports of one exercise: its checks, then (on a GPU, once they pass) its GPU
    checks. True if all passed."""
    if not runtime.HAS_CUDA or runtime.INTERPRET:
        report = _run_checks_in_time(exercise, impl=impl, path=path, seed=seed, timeout=timeout)
        print(format_report(report))
        if report.status == "passed":
            _say_why_no_gpu_checks(exercise)
        return report.status == "passed"
    name = short(resolve(exercise))
    print(f"{name}: checking through Triton's interpreter, as on a CPU ...", flush=True)
    report = run_checks_in_child(exercise, impl=impl, path=path, seed=seed, timeout=timeout)
    print(format_report(report), flush=True)
    if report.status != "passed" or not _has_gpu_checks(exercise) or _say_why_no_gpu_checks(exercise):
        return report.status == "passed"
    print(f"{name}: compiling your kernel for the GPU and running it at a real size (a fresh "
          "machine's first compile takes up to a minute) ...", flush=True)
    report = run_checks_in_child(exercise, impl=impl, path=path, seed=seed, timeout=timeout,
                                 gpu=True)
    print(format_report(report))
    return report.status == "passed"


def _has_gpu_checks(exercise) -> bool:
    return bool(getattr(load_grader(resolve(exercise)), "GPU_CHECKS", ()))


def _say_why_no_gpu_checks(exercise) -> bool:
    """For a grader whose GPU checks need a particular GPU (``gpu_checks_unavailable()``, ex12c's
    Hopper kernel): print why they do not run on this machine; True if they do not."""
    why = getattr(load_grader(resolve(exercise)), "gpu_checks_unavailable", lambda: None)()
    if why is not None:
        print(f"{short(resolve(exercise))}: its GPU check (your code compiled into a kernel on the GPU) "
              f"did not run: {why}.")
    return why is not None


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
        return _grade(exercise, impl=impl, path=path, seed=seed, timeout=timeout)
    except Exception as e:  # a broken grader or install: still never raise into a lesson
        print(f"{exercise}: could not run the grader: {type(e).__name__}: {e}")
        return False


def check_all(*, impl="exercises", path=None, seed=None, timeout=None) -> bool:
    """``check`` every exercise (each with its own time limit); True if all pass. Prints each
    exercise's time."""
    names = list_exercises()
    if not names:
        print(no_root_message())
        return False
    seed = default_seed() if seed is None else seed
    results = []
    for name in names:
        began = time.monotonic()
        results.append(check(name, impl=impl, path=path, seed=seed, timeout=timeout))
        print(f"({short(name)} took {time.monotonic() - began:.1f} s)\n")
    print(f"{sum(results)} of {len(results)} exercises passed")
    return all(results)


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))
