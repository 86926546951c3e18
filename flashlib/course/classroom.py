"""Instructor grading: ``flashlib grade SUBMISSIONS_DIR`` grades a class into a CSV and a table.

The checks are the graders' (tests/exercises/, the same ``check(impl, rng)`` functions as
``flashlib check``), but a submission's code never runs in the process that grades it:

- the files of the class are read once, before anything runs (what is graded is that copy), and
  the class folder is hashed before and after; anything changed is reported and restored;
- each (student, exercise) is parsed first: a syntax error, or code that reaches for the answer
  (flashlib beyond what the stub imports, ``solutions/``, ``exec``/``eval``/``__import__``/
  ``importlib``/``runpy``/``sys.modules``: ``integrity.borrowed``, which ``flashlib check`` runs
  too) is reported without running it ("not accepted: write it yourself (...)");
- otherwise ``flashlib.course.sandbox`` runs the file in a confined student process and the grader
  process runs the checks against proxies of its functions (see that module for the boundary
  and what confinement does and does not prevent). The student process may print, forge, patch
  or exit: the verdict is computed here, from the outputs it sends back, and can never exceed the
  number of checks. What the student process reports about itself (a read of a hidden folder, a
  graded function defined outside the file, a changed function of numpy, torch, Triton or
  flashlib) also makes the file "not accepted";
- grader processes (one per core) take (student, exercise) pairs; each pair has a wall-clock
  limit (``timeout``) that covers the grader's own work on its replies (``processes.supervise`` kills a
  grader process stuck past it), a memory limit for its student processes together (measured
  every 0.1 s from here), and its student process CPU-time, per-process memory, file-size and
  process-count limits. The progress bar counts students; the end says how long the class
  took, the slowest file, and what was and was not prevented (``limits``).

Statuses: "passed", "failed", "not done", "missing", "error: ...", "timeout (...)",
"crashed (...)" (among them "crashed (over the memory limit ...)"), "not accepted: ...". Every
student gets the same seed (the same inputs).
"""
import ast
import gc
import hashlib
import os
import pickle
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from . import processes, sandbox
from .checks import under_grade
from .class_folder import read_tree as _read_tree, restore as _restore, student_files as _student_files
from .copies import answer_names, flashlib_copy
from .class_report import UNCONFINED, format_table, summary, write_csv
from .files import find_root, implementation_path, list_exercises, no_root_message, resolve
from .grading import default_seed, run_one
from .integrity import NOT_ACCEPTED, borrowed as _borrowed, flashlib_uses
from .wire import frame

HIDDEN = ("solutions", "tests", ".git", "lessons")   # course folders hidden from student processes
GRADER_MEMORY = 3 << 29                              # a grader process's RLIMIT_DATA (1.5 GiB)
_PRELOAD = ("numpy", "flashlib", "torch", "triton")  # imported before the student's file
# One thread per process (on 2 busy cores one student took 22 s of grading with BLAS and torch
# threads fighting, 10 s without). Kernels through Triton's interpreter, on a GPU machine too:
# the graders' shapes are small, and on an H100 a test grading two students' ex05 and ex07 (and
# the same files in-process, to compare) spent most of its 345 s compiling kernels. No autotuning.
_WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "FLASHLIB_AUTOTUNE": "0", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


# ---------------------------------------------------------------------------------------------
# reading a submission without running it

def borrowed(tree, stub_tree):
    """Why a parsed file is not accepted (it reaches for the answer), or None:
    ``integrity.borrowed`` with what the stub imports from flashlib allowed."""
    return _borrowed(tree, flashlib_uses(stub_tree))


def _preload(tree):
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    return [m for m in _PRELOAD if m in imported]


# ---------------------------------------------------------------------------------------------
# one (student, exercise), in a grader process of the pool

_W = {}   # this grader process's settings, compiled graders and current sandbox


def _init_worker(settings):
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the main process's to handle

    def stop(*_):
        box = _W.get("box")
        if box is not None:
            try:
                os.killpg(box.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(1)
    signal.signal(signal.SIGTERM, stop)
    _W.update(settings)


def _worker_main():
    """A grader process (``python -m flashlib.course.classroom --worker``): settings, then tasks, as
    pickles on stdin; for each task a frame ("began", its clock) then a frame with its row, on
    stdout (the process's own: graders' prints go to stderr, and no student process shares
    these pipes)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]       # (its student processes set theirs)
    resource.setrlimit(resource.RLIMIT_DATA, (GRADER_MEMORY, hard))
    _init_worker(pickle.load(sys.stdin.buffer))
    while True:
        try:
            task = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        _send(out, ("began", time.monotonic()))
        _send(out, _grade_task(*task))


def _send(out, message):
    out.write(frame(pickle.dumps(message)))
    out.flush()


def _grader(name):
    if name not in _W.setdefault("modules", {}):
        path, text = _W["graders"][name]
        _W["modules"][name] = sandbox.module_from_source(path, text, f"_flashlib_grader_{name}")
    return _W["modules"][name]


def _display(path, root, submissions):
    for base in (submissions, root):
        if Path(path).is_relative_to(base):
            return str(Path(path).relative_to(base))
    return str(path)


def _why_not_accepted(flags, root, submissions):
    for flag in flags:
        if flag[0] == "read":
            return NOT_ACCEPTED.format(why=f"reads {_display(flag[1], root, submissions)}")
        if flag[0] == "write":
            return f"not accepted: tried to write {_display(flag[1], root, submissions)}"
        if flag[0] == "foreign":
            where = _display(flag[2], root, submissions) if flag[2] != "None" else "elsewhere"
            return NOT_ACCEPTED.format(why=f"{flag[1]} comes from {where}")
        if flag[0] == "patch":
            return f"not accepted: changes {flag[1]} while graded"
    return None


def _status(results):
    statuses = {r.status for r in results}
    if statuses == {"ok"}:
        return "passed"
    if "not done" in statuses:
        return "not done"
    if "error" in statuses:
        return "error: " + _cut(next(r.message for r in results if r.status == "error"))
    return "failed"


MAX_MESSAGE = 300   # characters of a student's error text that reach the CSV and the table


def _cut(text: str) -> str:
    """The first line of a student's error text, at most MAX_MESSAGE characters."""
    line = (text.splitlines() or [""])[0]
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE - 3] + "..."


def _crash(gone, box):
    """"crashed (exit code 3): <the last line it printed>", "crashed (killed by SIGKILL): ...",
    "timeout (CPU time ...)" or "crashed (garbled reply ...)"."""
    code = gone.returncode
    if code is None:
        return f"crashed ({gone})"
    if code < 0 and -code == getattr(signal, "SIGXCPU", None):
        return f"timeout (CPU time over {_W['timeout']:g} s)"
    signals = {-int(s): s.name for s in signal.Signals}
    why = f"killed by {signals.get(code, f'signal {-code}')}" if code < 0 else f"exit code {code}"
    return f"crashed ({why}): {box.last_line()}"


def _grade_task(student, name, files, filename):
    """Grade one file; returns {"passed", "status", "seconds"} (never raises)."""
    began = time.monotonic()
    try:
        row = _grade(student, name, files, filename, began + _W["timeout"])
    except Exception as e:               # a bug here, not the student's: say so, grade the rest
        row = {"passed": 0, "status": f"error: the grader failed: {type(e).__name__}: {e}"}
    return {**row, "seconds": round(time.monotonic() - began, 2)}


def _grade(student, name, files, filename, deadline):
    root, submissions = _W["root"], _W["submissions"]
    try:
        text = files[filename].decode("utf-8")
        tree = ast.parse(text, filename)
    except (UnicodeDecodeError, ValueError) as e:
        return {"passed": 0, "status": f"error: your file is not UTF-8 text ({e})"}
    except SyntaxError as e:
        return {"passed": 0, "status": f"error: your file does not parse: SyntaxError: {e.msg} "
                                       f"(line {e.lineno})"}
    why = borrowed(tree, ast.parse(_W["stubs"].get(name, "")))
    if why is not None:
        return {"passed": 0, "status": NOT_ACCEPTED.format(why=why)}
    grader = _grader(name)
    box = student_ = None
    try:
        box = _W["box"] = sandbox.Sandbox(
            files, filename, run_dir=_W["run_dir"], deadline=deadline,
            confine=_W["mode"] == "bubblewrap", hide=_W["hide"], protect=[root],
            course=_W["copies"][name], memory=_W["memory"], env=_W["env"], nproc=sandbox.NPROC)
        student_ = sandbox.Student(box, str(Path(submissions, student, filename)), text)
        reply = student_.load(_preload(tree) + list(getattr(grader, "PRELOAD", ())))
        passed = 0
        if reply["status"] == "not done":
            status = "not done"
        elif reply["status"] == "error":
            e = reply["error"]
            line = f" (line {e['line']})" if e.get("line") else ""
            message = _cut(f"{e['type']}: {e['message']}") if e["message"] else e["type"]
            status = f"error: your file fails on import: {message}{line}"
        else:
            gradable = under_grade(grader.CHECKS)
            results = []
            for check in gradable:
                results.append(run_one(check, student_.impl, _W["seed"]))
                if results[-1].exception is not None:   # its traceback holds the check's data
                    results[-1].exception = None
                    gc.collect()
            student_.finish()
            passed, status = (min(sum(r.status == "ok" for r in results), len(gradable)),
                              _status(results))
    except sandbox.SandboxTimeout:
        passed, status = 0, f"timeout (over {_W['timeout']:g} s)"
    except sandbox.SandboxGone as e:
        passed, status = 0, _crash(e, box)
    finally:
        _W["box"] = None
        if box is not None:
            box.close()
    refused = _why_not_accepted(student_.flags if student_ else [], root, submissions)
    return {"passed": 0, "status": refused} if refused else {"passed": passed, "status": status}


# ---------------------------------------------------------------------------------------------
# the class

def _hidden(root, submissions):
    """The folders the student process's audit hook refuses (what unconfined grading can hide)."""
    keep = [(root / "flashlib").resolve(), Path(sys.executable).resolve()]
    folders = [root / h for h in HIDDEN] + [submissions]
    return [str(f) for f in folders
            if f.exists() and not any(k.is_relative_to(f.resolve()) for k in keep)]


def limits(mode, why, timeout, memory) -> str:
    """What grading enforced on each file and what it did not prevent, as printed after the
    table (exercises/README.md says the same)."""
    confined = mode == "bubblewrap"
    if not confined:
        who = f"as you, unconfined ({why})"
    elif os.geteuid() == 0:
        who = "as nobody (uid 65534) under bubblewrap"
    else:
        who = "as uid 65534 in a user namespace under bubblewrap (your uid outside it)"
    count = f", at most {sandbox.NPROC} processes and threads" if confined else ""
    text = (f"each file: {timeout:g} s of wall clock (the grader's checks of its replies "
            f"included), {memory:g} GB of memory for its processes together (shared mappings "
            f"and forked children counted){count}, files of 16 MB; it ran {who}\nnot prevented: ")
    if not confined:
        return text + ("reading and writing wherever you can (the check that refuses solutions/, "
                       "tests/ and the class folder can be bypassed), processes that leave its "
                       "session, fork bombs, signals to your processes")
    return text + ("reading /usr and the Python runtime (nothing else of the machine is in its "
                   "view), using the CPU until the time limit, memory the kernel keeps for it "
                   "(pipe buffers, a 16 MB /dev/shm)")


class Unconfined(RuntimeError):
    """Confinement is unavailable here and grading without it was not asked for."""


def grade(submissions, *, out="grades.csv", timeout=60.0, jobs=None, exercises=None,
          seed=None, progress=True, memory=4.0, unconfined=False) -> list[dict]:
    """Grade every student's every exercise; write a CSV; print a table; return the rows.

    submissions: a folder holding one folder per student, each a copy of exercises/
    (STUDENT/exNN_topic.py or STUDENT/exercises/exNN_topic.py). Each (student, exercise) runs in
    its own confined process limited to ``timeout`` seconds (wall clock, the grader's checks
    included, and CPU) and ``memory`` GB (each process's private memory, and all its processes'
    memory together); ``jobs`` at a time (default: one per CPU core). exercises: names to
    grade (default: all). The same ``seed`` (inputs) for every student.
    unconfined: grade even where bubblewrap is unavailable (no read-only files, hidden
    folders or network cut: a student's file could then write to the course and class folders);
    otherwise that raises ``Unconfined`` before any file runs.
    Rows: {"student", "exercise", "passed", "total", "status", "seconds"}.
    """
    from tqdm.auto import tqdm

    began = time.monotonic()
    root = find_root()
    if root is None:
        raise FileNotFoundError(no_root_message())
    root, submissions = Path(root).resolve(), Path(submissions).resolve()
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of student folders")
    for arg, value in (("timeout", timeout), ("memory", memory), ("jobs", jobs or 1)):
        if not value > 0:
            raise ValueError(f"{arg} must be > 0, got {value!r}")
    out = None if out is None else Path(out).resolve()
    names = [resolve(e, root) for e in exercises] if exercises else list_exercises(root)
    graders = {n: (str(root / "tests" / "exercises" / f"test_{n}.py"),
                   (root / "tests" / "exercises" / f"test_{n}.py").read_text(encoding="utf-8"))
               for n in names}
    totals = {n: len(under_grade(
        sandbox.module_from_source(*graders[n], f"_flashlib_grader_{n}").CHECKS)) for n in names}
    stub = lambda n: root / "exercises" / f"{n}.py"  # noqa: E731
    stubs = {n: stub(n).read_text(encoding="utf-8") for n in names if stub(n).is_file()}
    students = sorted(p for p in submissions.iterdir()
                      if p.is_dir() and not p.name.startswith((".", "_")))
    linked = {p.name for p in students if p.is_symlink()}   # graded as missing, said so
    seed = default_seed() if seed is None else int(seed)
    jobs = jobs or os.cpu_count() or 1
    before = _read_tree(submissions)

    rows, tasks = {}, []
    for student in students:
        inner = student / "exercises"
        folder = inner if inner.is_dir() and not inner.is_symlink() else student
        files = {} if student.name in linked else _student_files(folder)
        for name in names:
            file = implementation_path(name, path=folder)
            rows[student.name, name] = {"student": student.name, "exercise": name, "passed": 0,
                                        "total": totals[name], "seconds": 0.0,
                                        "status": "not accepted: the student's folder is a link"
                                        if student.name in linked else "missing"}
            if str(file.relative_to(folder)) in files:
                tasks.append((student.name, name, files, str(file.relative_to(folder))))
    run_dir = Path(tempfile.mkdtemp(prefix="flashlib-grade-")).resolve()
    run_dir.chmod(0o755)                      # the copies below: read by the sandbox's user
    hide = _hidden(root, submissions)
    mode, why = sandbox.probe()
    if mode == "none" and not unconfined:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise Unconfined(f"no confinement here ({why}): a student's file would run with your "
                         "rights, able to read your files and write to the course and class "
                         "folders. Grade where bubblewrap works (Linux, pip install "
                         "'flashlib[grading]'), or pass --unconfined (unconfined=True) to grade "
                         "anyway")
    copies = {n: str(run_dir / f"flashlib-{n}") for n in names}
    for n in names:
        flashlib_copy(copies[n], answer_names(graders[n][1]))
    confinement = (UNCONFINED if mode == "none" else
                   "bubblewrap: as nobody" if os.geteuid() == 0 else
                   "bubblewrap: as uid 65534 in a user namespace")
    for row in rows.values():
        row["confinement"] = confinement
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL") if k in os.environ}
    env.update(_WORKER_ENV, FLASHLIB_ROOT=str(root))
    settings = dict(root=root, submissions=submissions, graders=graders, stubs=stubs, seed=seed,
                    timeout=float(timeout), memory=int(memory * (1 << 30)), mode=mode, hide=hide,
                    run_dir=str(run_dir), env=env, copies=copies)
    left = {s.name: sum(t[0] == s.name for t in tasks) for s in students}
    bar = tqdm(total=len(students), desc="grading", unit="student", disable=not progress)
    bar.update(sum(n == 0 for n in left.values()))

    def done(task, row):
        rows[task[:2]].update(row)
        left[task[0]] -= 1
        bar.update(left[task[0]] == 0)
    try:
        processes.run_workers(tasks, jobs, settings, dict(os.environ, **_WORKER_ENV), done)
    finally:
        bar.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    integrity = _restore(submissions, before)
    table = [rows[s.name, n] for s in students for n in names]

    if out is not None:
        write_csv(table, out)
    print(format_table(table, [s.name for s in students], names, seed=seed, out=out))
    print(summary(table, time.monotonic() - began, jobs, timeout, mode, why, len(students)))
    print(limits(mode, why, timeout, memory))
    print(integrity)
    return table


if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        sys.exit("usage: python -m flashlib.course.classroom --worker (internal; use `flashlib grade`)")
    # the package's copy of this module, not __main__: one copy of the grading modules, one sandbox
    from flashlib.course.classroom import _worker_main as worker
    worker()
