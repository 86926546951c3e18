"""Work the session hands to other processes as soon as its tests are collected, so that it runs
on CI's second core while the main pytest process runs the rest.

Two kinds of job, started by conftest.py for the tests that need them:
- one file of tests/seed_sweep.py (a reference solution, a variant or a mutant graded with the
  session's seed, then with the sweep's other seeds): its report is what
  test_mutants.py's test_mutant_is_rejected / test_solution_passes assert on, its verdicts what
  test_verdicts_do_not_depend_on_the_seed does;
- the lessons under nbval (``run_lessons``): one second pytest process that executes the
  notebooks exactly as ``pytest lessons/`` does (--nbval-lax --nbval-current-env, with
  lessons/conftest.py's time limit); test_notebooks.py's test_lesson_runs_under_nbval reads its
  outcome, one test per lesson.

The tests that read a job are moved to the end of the session. A job not started yet when its
test asks for it is taken back and run in the main process (``Jobs.result``), as is any other job
still waiting while the one asked for runs: the two cores stay busy to the end. Workers are
spawned, not forked: the parent has imported torch and Triton.
"""
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))
JOBS = pytest.StashKey["Jobs"]()        # config.stash: the session's jobs
LESSON_JOB = ("lessons",)               # the key of the lesson run
# test_notebooks.py's tests that read the lesson run
EXECUTION_TESTS = ("test_lesson_runs_under_nbval", "test_lessons_keep_their_time_limit")


def workers():
    """One core is left to the main pytest process; at most 8 workers."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min((cores or 1) - 1, 8))


class Jobs:
    """Named jobs (key -> function and arguments) run by a process pool, any of which the main
    process can take back while it has not started."""

    def __init__(self):
        self.pool = ProcessPoolExecutor(workers(), mp_context=multiprocessing.get_context("spawn"))
        self.calls, self.futures, self.here = {}, {}, {}

    def submit(self, key, fn, *args):
        self.calls[key] = (fn, args)
        self.futures[key] = self.pool.submit(fn, *args)

    def __contains__(self, key):
        return key in self.calls

    def _run_here(self, key):
        fn, args = self.calls[key]
        try:
            self.here[key] = (True, fn(*args))
        except Exception as e:      # raised where the result is asked for, as a future would
            self.here[key] = (False, e)

    def result(self, key):
        """The job's result (or its exception); while it runs in a worker, the main process runs
        the jobs that have not started, last submitted first."""
        future = self.futures[key]
        if key not in self.here and future.cancel():
            self._run_here(key)
        while key not in self.here and not future.done():
            waiting = next((k for k in reversed(list(self.calls)) if k not in self.here
                            and self.futures[k].cancel()), None)
            if waiting is None:
                break
            self._run_here(waiting)
        if key in self.here:
            ok, value = self.here[key]
            if ok:
                return value
            raise value
        return future.result()

    def shutdown(self):
        """At the end of the session (also after a failure with -x, or ^C): a lesson run still
        going is interrupted as ^C would, then the pool is closed."""
        for key, (fn, args) in self.calls.items():
            if fn is run_lessons and not self.futures[key].done():
                stop_lessons(args[1])
        self.pool.shutdown(wait=True, cancel_futures=True)


def result(config, key, fn, *args):
    """The result of job ``key``, run here now if the session did not start it in the background
    (a test the collection did not announce, e.g. run by a plugin)."""
    jobs = config.stash.get(JOBS, None)
    if jobs is None or key not in jobs:
        return fn(*args)
    return jobs.result(key)


def run_lessons(notebooks, folder):
    """Execute ``notebooks`` (paths) under nbval in a second pytest process, as `pytest lessons/`
    does. Returns {"rc": exit code, "seconds": wall time, "items": {nodeid: (outcome, text,
    seconds)}, "log": the output's last lines}; ``folder`` holds its log, JUnit XML and pid."""
    folder = Path(folder)
    xml, log = folder / "lessons.xml", folder / "lessons.log"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
               "--nbval-lax", "--nbval-current-env", "-q", f"--junitxml={xml}",
               *map(str, notebooks)]
    start = time.perf_counter()
    with open(log, "w") as out:
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}   # e.g. -m, --impl
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   env=env)
        (folder / "lessons.pid").write_text(str(process.pid))
        try:
            rc = process.wait()
        except BaseException:
            process.kill()
            raise
    seconds = time.perf_counter() - start
    items = {}
    if xml.is_file():
        for case in ET.parse(xml).iter("testcase"):
            classname, name = case.get("classname", ""), case.get("name", "")
            nodeid = (f"{classname.replace('.', '/', 1)}::{name}" if classname.endswith(".ipynb")
                      else f"{classname}::{name}")
            bad = [child for child in case if child.tag in ("failure", "error")]
            skipped = [child for child in case if child.tag == "skipped"]
            outcome = bad[0].tag if bad else "skipped" if skipped else "passed"
            text = "\n".join(filter(None, [bad[0].get("message", ""), bad[0].text or ""])) \
                if bad else ""
            text = re.sub(r"#x1B\[[0-9;]*m", "", text)       # the colours, as JUnit escapes them
            items[nodeid] = (outcome, text, float(case.get("time", 0) or 0))
    tail = log.read_text(errors="replace").splitlines()[-60:] if log.is_file() else []
    return {"rc": rc, "seconds": seconds, "items": items, "log": "\n".join(tail)}


def stop_lessons(folder):
    """^C for the lesson run's pytest (it stops its notebook kernels itself)."""
    try:
        os.kill(int((Path(folder) / "lessons.pid").read_text()), signal.SIGINT)
    except (OSError, ValueError):
        pass


def check_lesson(outcome, notebook):
    """Fail, with nbval's text, unless every item of ``notebook`` (a path relative to the course
    root, e.g. "lessons/09_block_sparse.ipynb") passed in the lesson run ``outcome``."""
    if outcome["rc"] not in (0, 1):      # interrupted, an internal or a usage error
        pytest.fail(f"the lesson run exited with code {outcome['rc']}; its output ends:\n"
                    f"{outcome['log']}", pytrace=False)
    mine = {nodeid: item for nodeid, item in outcome["items"].items()
            if nodeid.partition("::")[0] == notebook}
    if not mine:
        pytest.fail(f"nbval ran no cell of {notebook} (exit code {outcome['rc']}); the lesson "
                    f"run's output ends:\n{outcome['log']}", pytrace=False)
    bad = {nodeid: item for nodeid, item in mine.items() if item[0] in ("failure", "error")}
    if bad:
        pytest.fail("\n\n".join(f"{nodeid}: {outcome_}\n{text[-4000:]}"
                                for nodeid, (outcome_, text, _) in bad.items()), pytrace=False)
