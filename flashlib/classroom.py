"""Instructor grading: ``flashlib grade SUBMISSIONS_DIR`` grades a class into a CSV and a table.

Every student's every exercise runs in its own subprocess (``python -m flashlib.classroom
--worker``) with a time limit, so a hanging, crashing or unparsable submission is reported
(``timeout``, ``crashed``, ``error: ...``), never fatal. The checks themselves are the graders'
(``flashlib.grading.run_checks``), the same code as ``flashlib check``. Grading runs the students'
code with the grader's rights: a teaching aid, not a sandbox.
"""
import csv
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .grading import (_NO_ROOT, _RESULT_TAG, _ROOT_ENV, default_seed, find_root, implementation_path,
                      list_exercises, load_grader, resolve, run_checks, short)

def _worker(exercise: str, path: str, seed: int) -> None:
    """Entry of the grading subprocess: grade one file, print the result as one tagged line."""
    report = run_checks(exercise, path=path, seed=seed)
    status = report.status
    if status == "error":
        errors = [r.message for r in report.results if r.status == "error"]
        status = "error: " + (report.problem or errors[0]).splitlines()[0]
    print(_RESULT_TAG + json.dumps({"passed": report.passed, "total": report.total,
                                    "status": status}), flush=True)


def _grade_one(file: Path, name: str, seed: int, timeout: float, root: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1", **{_ROOT_ENV: str(root)})
    cmd = [sys.executable, "-m", "flashlib.classroom", "--worker", name, str(file), str(seed)]
    posix = os.name == "posix"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=root, start_new_session=posix)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if posix:  # the whole process group, in case the submission started children
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            proc.kill()
        proc.communicate()
        return {"passed": 0, "status": f"timeout (over {timeout:g} s)"}
    for line in reversed(out.splitlines()):
        if line.startswith(_RESULT_TAG):
            result = json.loads(line[len(_RESULT_TAG):])
            return {"passed": result["passed"], "status": result["status"]}
    last = (err.strip().splitlines() or ["no output"])[-1]
    return {"passed": 0, "status": f"crashed (exit code {proc.returncode}): {last}"}


def _short_status(status: str) -> str:
    return status.split(":")[0].split(" (")[0]


def grade(submissions, *, out="grades.csv", timeout=60.0, jobs=None, exercises=None,
          seed=None, progress=True) -> list[dict]:
    """Grade every student's every exercise; write a CSV; print a table; return the rows.

    submissions: a folder holding one folder per student, each a copy of exercises/
    (STUDENT/exNN_topic.py). Each (student, exercise) runs in its own subprocess limited to
    ``timeout`` seconds; ``jobs`` of them at a time (default: one per CPU core).
    exercises: names to grade (default: all). The same ``seed`` (inputs) for every student.
    Rows: {"student", "exercise", "passed", "total", "status"}; status is "passed", "failed",
    "not done", "missing", "error: ...", "timeout (...)" or "crashed (...)".
    """
    from tqdm.auto import tqdm

    root = find_root()
    if root is None:
        raise FileNotFoundError(_NO_ROOT.format(where=Path(__file__).resolve().parent))
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of student folders")
    names = [resolve(e, root) for e in exercises] if exercises else list_exercises(root)
    totals = {name: len(load_grader(name, root).CHECKS) for name in names}
    students = sorted(p for p in submissions.iterdir()
                      if p.is_dir() and not p.name.startswith((".", "_")))
    seed = default_seed() if seed is None else int(seed)
    jobs = jobs or os.cpu_count() or 1

    rows, tasks = {}, {}
    for student in students:
        folder = student / "exercises" if (student / "exercises").is_dir() else student
        for name in names:
            file = implementation_path(name, path=folder)
            row = {"student": student.name, "exercise": name, "passed": 0,
                   "total": totals[name], "status": "missing"}
            rows[student.name, name] = row
            if file.is_file():
                tasks[student.name, name] = file
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_grade_one, file, key[1], seed, timeout, root): key
                   for key, file in tasks.items()}
        for future in tqdm(as_completed(futures), total=len(futures), desc="grading",
                           unit="file", disable=not progress):
            rows[futures[future]].update(future.result())
    table = [rows[s.name, n] for s in students for n in names]

    if out is not None:
        with open(out, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["student", "exercise", "passed", "total",
                                                   "status"])
            writer.writeheader()
            writer.writerows(table)
    print(format_table(table, [s.name for s in students], names, seed=seed, out=out))
    return table


def format_table(rows, students, names, *, seed=None, out=None) -> str:
    """Students down, exercises across: "3/5" per cell, or a one-word status."""
    cells = {(r["student"], r["exercise"]): r for r in rows}
    header = ["student", *(short(n) for n in names), "total"]
    body = []
    for s in students:
        line, got, total = [s], 0, 0
        for n in names:
            r = cells[s, n]
            got, total = got + r["passed"], total + r["total"]
            word = _short_status(r["status"])
            line.append(f"{r['passed']}/{r['total']}" if word in ("passed", "failed") else word)
        line.append(f"{got}/{total}")
        body.append(line)
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
    text = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [header, *body]]
    foot = []
    if seed is not None:
        foot.append(f"seed {seed}")
    if out is not None:
        foot.append(f"details (status per exercise) in {out}")
    return "\n".join(text + ([", ".join(foot)] if foot else []))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        # run the package's copy of this module, not __main__, so that there is one flashlib.grading
        # whose CheckFailed the graders raise and run_checks catches
        from flashlib.classroom import _worker as worker
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit("usage: python -m flashlib.classroom --worker EXERCISE FILE SEED "
                 "(internal; use `flashlib check` or `flashlib grade`)")
