"""Shared pytest set-up: the graders' --impl switch, one marker per exercise, one seed per run,
the quick tier, and the work started in the background once tests are collected.

    pytest tests/exercises                       grade your work in exercises/ (the default)
    pytest tests/exercises --impl=solutions      grade the reference answers (CI)
    pytest tests/exercises --impl=PATH           grade one exNN_*.py file, or a folder of them
    pytest tests/exercises -m ex01               one exercise
    FLASHLIB_SEED=1234 pytest tests/exercises    replay the inputs of a failing run
    pytest -m quick --impl=solutions             the quick tier (QUICK below)
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

import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

import background  # noqa: E402  (tests/background.py)
import seed_sweep  # noqa: E402  (tests/seed_sweep.py)
from flashlib import course  # noqa: E402
from flashlib.course import grading

ROOT = Path(__file__).resolve().parent.parent
SEED = grading.default_seed()
JOBS = background.JOBS
LESSON_FOLDER = pytest.StashKey[str]()  # the lesson run's folder (log, JUnit XML, pid)

# The quick tier (`pytest -m quick`): library correctness on tiny shapes, the reference and the
# tolerance rule, layout and packaging, every grader on its exercise (with --impl=solutions: the
# reference answers), the exercise stubs' sync, notebook hygiene, and the mutants' bookkeeping.
# Not: the lessons' execution, the seed sweep and the graded mutants, the hostile class and the
# other classroom/CLI tests, distributed, block-sparse, benchmarks; within the modules below, not
# the torch.compile and opcheck tests (seconds each for compilation) nor those marked slow.
QUICK_MODULES = {
    "test_reference.py", "test_testing.py", "test_layout.py", "test_packaging.py",
    "test_exercise_sync.py", "test_softmax.py", "test_tiled.py", "test_flash_attention.py",
    "test_launch.py", "test_versions.py", "test_schedule.py", "test_iosim.py", "test_primer.py",
    "test_decode.py", "test_varlen.py", "test_paged.py", "test_fp8.py", "test_gpt.py",
    "test_score_mods.py", "test_mbarrier.py",
    "test_notebooks.py", "test_mutants.py",
}
NOT_QUICK = (seed_sweep.TEST, *seed_sweep.GRADED, *background.EXECUTION_TESTS)


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


def is_quick(item):
    path = Path(str(item.fspath))
    return ((path.parent.name == "exercises" or path.name in QUICK_MODULES)
            and getattr(item, "originalname", item.name) not in NOT_QUICK
            and "torch_compile" not in item.name and "opcheck" not in item.name
            and "slow" not in item.keywords)


def reads_background(item):
    """0: the other tests, 1: those reading the lesson run (started first), 2: the graded files."""
    name = getattr(item, "originalname", None)
    return 1 if name in background.EXECUTION_TESTS else 2 if name in NOT_QUICK else 0


@pytest.hookimpl(tryfirst=True)      # before -m and -k deselect
def pytest_collection_modifyitems(config, items):
    """Mark the quick tier. The tests that read background work (tests/background.py) go last,
    the rest keeping their order. A lesson collected by nbval itself (``pytest tests lessons``)
    is not run a second time by test_lesson_runs_under_nbval (nor is the time limit's test,
    lessons/conftest.py's own item then being in the session). Tests marked ``gpu`` need a CUDA
    GPU: skip them, saying so, on a machine without one."""
    from flashlib import runtime

    for item in items:
        if is_quick(item):
            item.add_marker(pytest.mark.quick)
    run_by_nbval = {item.nodeid.partition("::")[0] for item in items if ".ipynb::" in item.nodeid}
    if run_by_nbval:
        twice = [item for item in items
                 if getattr(item, "originalname", None) == "test_lessons_keep_their_time_limit"
                 or getattr(item, "originalname", None) == "test_lesson_runs_under_nbval"
                 and f"lessons/{item.callspec.params['path'].name}" in run_by_nbval]
        config.hook.pytest_deselected(items=twice)
        items[:] = [item for item in items if item not in twice]
    items.sort(key=reads_background)  # stable
    if runtime.HAS_CUDA and not runtime.INTERPRET:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start the background work the collected tests read: the lessons under nbval, then the
    seed sweep's files (tests/background.py, tests/seed_sweep.py)."""
    config = session.config
    if config.option.collectonly:
        return
    lessons = sorted({item.callspec.params["path"] for item in session.items
                      if getattr(item, "originalname", None) == "test_lesson_runs_under_nbval"})
    if any(getattr(item, "originalname", None) == "test_lessons_keep_their_time_limit"
           for item in session.items):
        lessons = background.LESSONS
    graded = [item for item in session.items if getattr(item, "originalname", None) in
              (seed_sweep.TEST, *seed_sweep.GRADED)]
    if not lessons and not graded:
        return
    jobs = config.stash[JOBS] = background.Jobs()
    if lessons:
        folder = config.stash[LESSON_FOLDER] = tempfile.mkdtemp(prefix="flashlib-lessons-")
        jobs.submit(background.LESSON_JOB, background.run_lessons, lessons, folder)
    seed_sweep.submit(jobs, graded, SEED)


def pytest_sessionfinish(session):
    jobs = session.config.stash.get(JOBS, None)
    if jobs is not None:
        jobs.shutdown()
    folder = session.config.stash.get(LESSON_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, config):
    """The background lesson run's time and its slowest lessons (its cells ran in another
    process, so --durations does not list them)."""
    jobs = config.stash.get(JOBS, None)
    if jobs is None or background.LESSON_JOB not in jobs:
        return
    future = jobs.futures[background.LESSON_JOB]
    done = jobs.here.get(background.LESSON_JOB) or \
        ((True, future.result()) if future.done() and not future.cancelled()
         and future.exception() is None else None)
    if not done or not done[0]:
        return
    outcome, seconds = done[1], {}
    for nodeid, (_, _, t) in outcome["items"].items():
        path = nodeid.partition("::")[0]
        if path.endswith(".ipynb"):
            seconds[path] = seconds.get(path, 0.0) + t
    terminalreporter.section("lessons under nbval (in the background)")
    for path, t in sorted(seconds.items(), key=lambda kv: -kv[1])[:8]:
        terminalreporter.write_line(f"{t:7.1f} s  {path}")
    terminalreporter.write_line(f"{sum(seconds.values()):7.1f} s  of cells, "
                                f"{outcome['seconds']:.1f} s wall for the lesson run")


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
