"""Shared pytest set-up: the graders' --impl switch, one marker per exercise, one seed per run.

    pytest tests/exercises                       grade your work in exercises/ (the default)
    pytest tests/exercises --impl=solutions      grade the reference answers (CI)
    pytest tests/exercises --impl=PATH           grade one exNN_*.py file, or a folder of them
    pytest tests/exercises -m ex01               one exercise
    FLASHLIB_SEED=1234 pytest tests/exercises    replay the inputs of a failing run
"""
import os
from pathlib import Path

# NumPy's BLAS threads and torch's fight over CI's 2 cores (a small batched matmul: 140 ms instead
# of 0.4 ms); one BLAS thread, set before numpy loads (nothing imports numpy before this file).
# A value given from outside wins, so the suite can be run under other BLAS settings, e.g.
# OPENBLAS_NUM_THREADS=2 or OPENBLAS_CORETYPE=SkylakeX; the report's header names those in effect.
# Notebook kernels inherit them.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# torch's OpenMP threads likewise: the seed sweep runs beside the main process from the start, and
# two threads each on 2 cores made a grader's tiny float64 matmuls take 12 ms instead of 8 us
os.environ.setdefault("OMP_NUM_THREADS", "1")
BLAS_SETTINGS = ", ".join(f"{name}={value}" for name, value in sorted(os.environ.items())
                          if name in ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS",
                                      "MKL_NUM_THREADS"))

import pytest  # noqa: E402

import seed_sweep  # noqa: E402  (tests/seed_sweep.py)
from flashlib import course  # noqa: E402
from flashlib.course import grading

ROOT = Path(__file__).resolve().parent.parent
SEED = grading.default_seed()


def pytest_addoption(parser):
    group = parser.getgroup("flashlib exercises")
    group.addoption("--impl", default="exercises",
                    help="what the graders in tests/exercises test: 'exercises' (your work, the "
                         "default), 'solutions' (the answers, as CI does), or the path of one "
                         "exNN_*.py file or of a folder holding them")


def pytest_configure(config):
    for name in course.list_exercises(ROOT):
        config.addinivalue_line("markers", f"{course.short(name)}: grader of exercise {name}")


def pytest_report_header(config):
    return [f"exercise graders: --impl={config.getoption('--impl')}, seed {SEED} "
            f"(replay with FLASHLIB_SEED={SEED})", f"BLAS settings: {BLAS_SETTINGS}"]


def pytest_collection_modifyitems(config, items):
    """The seed sweep's verdicts are read last (it runs in the background meanwhile). Tests marked
    ``gpu`` need a CUDA GPU: skip them, saying so, on a machine without one."""
    from flashlib import runtime

    items.sort(key=lambda item: getattr(item, "originalname", None) == seed_sweep.TEST)  # stable
    if runtime.HAS_CUDA and not runtime.INTERPRET:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start the seed sweep of the collected test_verdicts_do_not_depend_on_the_seed items."""
    exercises = [item.callspec.params["exercise"] for item in session.items
                 if getattr(item, "originalname", None) == seed_sweep.TEST]
    if exercises and not session.config.option.collectonly:
        pool, futures = seed_sweep.start(exercises, SEED)
        session.config.stash[seed_sweep.POOL], session.config.stash[seed_sweep.FUTURES] = \
            pool, futures


def pytest_sessionfinish(session):
    pool = session.config.stash.get(seed_sweep.POOL, None)
    if pool is not None:
        pool.shutdown(cancel_futures=True)


@pytest.fixture(scope="session")
def grader_seed():
    return SEED


@pytest.fixture
def exercise_impl(request):
    """The implementation the current grader tests, freshly loaded from disk."""
    name = Path(request.module.__file__).stem.removeprefix("test_")   # "ex01_safe_softmax"
    impl = request.config.getoption("--impl")
    if impl not in ("exercises", "solutions"):
        path = Path(impl)
        if path.is_file() and course.exercise_number(path.name) != course.exercise_number(name):
            pytest.skip(f"--impl={impl} is not exercise {course.short(name)}")
    file = course.implementation_path(name, impl=impl, root=ROOT)
    if not file.is_file():
        pytest.fail(f"{file} is missing", pytrace=False)
    try:
        return course.load_module(file)
    except NotImplementedError:
        pytest.fail(f"not done yet: replace the NotImplementedError in {file}", pytrace=False)
    except SyntaxError as e:
        pytest.fail(f"{file} does not parse: {e.msg} (line {e.lineno})", pytrace=False)
