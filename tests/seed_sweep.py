"""The 12-seed sweep of tests/test_mutants.py, run in the background from the start of a session.

Every mutant, solution and correct variant goes through its grader under SEEDS seeds: about 12
minutes on one core with 20 seeds, most of it the Triton exercises through the interpreter. ``start`` (called
by conftest once tests are collected) hands the files to a pool of worker processes (one core is
left to the main pytest process), so the sweep runs while the other tests do;
``test_verdicts_do_not_depend_on_the_seed``, moved to the end of the session, collects the
verdicts. Workers are spawned, not forked: the parent has imported torch and Triton.
"""
import ast
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from flashlib import course
from flashlib.course import grading, integrity

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = sorted((ROOT / "tests" / "mutants").glob("ex[0-9]*_*.py"))
VARIANTS = sorted((ROOT / "tests" / "variants").glob("ex[0-9]*_*.py"))
SEEDS = 12       # 20 until 2026-11-25: the sweep was the suite's long pole on 2 cores
TEST = "test_verdicts_do_not_depend_on_the_seed"
FUTURES = pytest.StashKey[dict]()           # config.stash: exercise -> futures of its files
POOL = pytest.StashKey[ProcessPoolExecutor]()


def mine(files, exercise):
    return [f for f in files if course.exercise_number(f.stem) == course.exercise_number(exercise)]


def sweep(exercise, path, seeds):
    """One file under every seed: the problems found, as lines. A mutant must fail some check
    (its first failure ends that seed; the check that failed goes first for the next seed); a
    solution or variant must pass every check."""
    grader = course.load_grader(exercise, ROOT)
    allowed = integrity.allowed_flashlib(grader, exercise, ROOT)
    is_correct = path.parent.name in ("solutions", "variants")
    why = integrity.borrowed(ast.parse(path.read_text()), allowed)
    with integrity.tripwire(getattr(grader, "FLASHLIB_ANSWERS", ()), path):
        module = None if why else course.load_module(path)
    why = why or integrity.foreign(module, allowed, ROOT)
    if why is not None:
        return [f"{path.name} is refused: {why}"] if is_correct else []   # refused whatever the seed
    problems, checks = [], list(grader.CHECKS)
    for seed in seeds:
        for check in checks:
            result = grading.run_one(check, module, seed)
            if not is_correct and result.status != "ok":
                checks.remove(check)      # a mutant: try the check that caught it first next seed
                checks.insert(0, check)
                break
            if is_correct and result.status != "ok":
                problems.append(f"{path.name} fails {check.__name__} with seed {seed}: "
                                f"{result.message.splitlines()[0]}")
        else:
            if not is_correct:
                problems.append(f"{path.name} is accepted with seed {seed}")
    return problems


def start(exercises, first_seed):
    """Submit every file of ``exercises``; returns (pool, {exercise: [future, ...]})."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    pool = ProcessPoolExecutor(max(1, min((cores or 1) - 1, 8)),
                               mp_context=multiprocessing.get_context("spawn"))
    seeds = [first_seed + 7919 * i for i in range(SEEDS)]
    futures = {exercise: [pool.submit(sweep, exercise, path, seeds) for path in
                          [ROOT / "solutions" / f"{exercise}.py", *mine(VARIANTS, exercise),
                           *mine(MUTANTS, exercise)]]
               for exercise in exercises}
    return pool, futures
