"""The seed sweep of tests/test_mutants.py, run in the background from the start of a session.

Every mutant, solution and correct variant goes through its grader: first with the session's
seed exactly as a learner's file is graded (``grading.run_checks``: the report that
test_mutant_is_rejected and test_solution_passes assert on), then under the sweep's other seeds
(SEEDS in all). One job per file (``grade``), handed by conftest to tests/background.py's pool
as soon as tests are collected, so the grading runs on CI's second core while the main process
runs the other tests; the tests that read the jobs are moved to the end of the session. About
3 minutes on one quiet core, most of it the Triton exercises' solutions and variants through the
interpreter (every check under every seed); a mutant stops at its first failing check per seed.
"""
import ast
import zlib
from pathlib import Path

from flashlib import course
from flashlib.course import grading, integrity

from background import ROOT

MUTANTS = sorted((ROOT / "tests" / "mutants").glob("ex[0-9]*_*.py"))
VARIANTS = sorted((ROOT / "tests" / "variants").glob("ex[0-9]*_*.py"))
# 20 until 2026-11-25, 12 until 2026-11-28 (the sweep is a third of the suite's CPU time on 2
# cores). Each session draws a fresh first seed, and since 2026-11-28 every file has its own other
# seeds (``seeds``): a grader's input generator sees 8 x (its solution, variants and mutants)
# distinct seeds a run, where 12 seeds were shared by all of an exercise's files.
SEEDS = 8
TEST = "test_verdicts_do_not_depend_on_the_seed"
GRADED = ("test_mutant_is_rejected_with_its_hint", "test_solution_passes")   # read grade()'s report


def mine(files, exercise):
    return [f for f in files if course.exercise_number(f.stem) == course.exercise_number(exercise)]


def files(exercise):
    """The files the sweep grades for ``exercise``: its solution, variants and mutants."""
    return [ROOT / "solutions" / f"{exercise}.py", *mine(VARIANTS, exercise),
            *mine(MUTANTS, exercise)]


def seeds(first_seed, path, sweep=True):
    """The session's seed (the graded report's), then, if ``sweep``, SEEDS - 1 more of the file's
    own: derived from the session's seed and the file's name, so FLASHLIB_SEED replays them."""
    own = zlib.crc32(Path(path).name.encode())
    return [first_seed] + [(first_seed + 7919 * i + own) % 2**31
                           for i in range(1, SEEDS if sweep else 1)]


def grade(exercise, path, seeds):
    """One file under every seed. Returns (report, problems): ``report`` is the first seed's
    graded report as a dict (status, passed, total, graded: whether any check ran, text: the
    formatted report); ``problems`` the sweep's findings as lines. A mutant must fail some check
    (its first failure ends that seed; the check that failed goes first for the next seed); a
    solution or variant must pass every check."""
    is_correct = path.parent.name in ("solutions", "variants")
    report = grading.run_checks(exercise, path=path, seed=seeds[0], root=ROOT)
    first = dict(status=report.status, passed=report.passed, total=report.total,
                 graded=bool(report.results), text=grading.format_report(report))
    if report.problem is not None and not report.results:
        # refused (borrowed code, flashlib's answer taken at import) or not loadable: so for
        # every seed; a mutant is thereby rejected
        return first, ([f"{path.name} is refused: {report.problem}"] if is_correct else [])
    grader = course.load_grader(exercise, ROOT)
    problems, checks = [], list(grader.CHECKS)
    # the first seed: the report's results, one per check in order (a check found taking an
    # answer of flashlib's ends the report, as it ends grading)
    for check, result in zip(list(checks), report.results):
        if result.status != "ok":
            if not is_correct:
                checks.remove(check)
                checks.insert(0, check)
                break
            problems.append(f"{path.name} fails {check.__name__} with seed {seeds[0]}: "
                            f"{(result.message.splitlines() or [''])[0]}")
    else:
        if not is_correct:
            problems.append(f"{path.name} is accepted with seed {seeds[0]}")
    if len(seeds) == 1:
        return first, problems
    allowed = integrity.allowed_flashlib(grader, exercise, ROOT)
    assert integrity.borrowed(ast.parse(path.read_text()), allowed) is None   # checked above
    with integrity.tripwire(getattr(grader, "FLASHLIB_ANSWERS", ()), path):
        module = course.load_module(path)
    for seed in seeds[1:]:
        for check in checks:
            result = grading.run_one(check, module, seed)
            if not is_correct and result.status != "ok":
                checks.remove(check)      # a mutant: try the check that caught it first next seed
                checks.insert(0, check)
                break
            if is_correct and result.status != "ok":
                problems.append(f"{path.name} fails {check.__name__} with seed {seed}: "
                                f"{(result.message.splitlines() or [''])[0]}")
        else:
            if not is_correct:
                problems.append(f"{path.name} is accepted with seed {seed}")
    return first, problems


def submit(jobs, items, first_seed):
    """Submit a ``grade`` job for every file the collected ``items`` read: all files of an
    exercise whose verdict test is collected (under every seed), the solution of a collected
    test_solution_passes and the mutant of a collected test_mutant_is_rejected (the first seed
    only, unless the verdict test is collected too). Solutions and variants go first: they cost
    the most (every check under every seed) and the main process takes back the last jobs."""
    swept, first_only = [], []
    for item in items:
        name, params = getattr(item, "originalname", None), getattr(item, "callspec", None)
        if name == TEST:
            swept.append(params.params["exercise"])
        elif name == "test_solution_passes":
            first_only.append((params.params["exercise"], ROOT / "solutions" /
                               f"{params.params['exercise']}.py"))
        elif name == "test_mutant_is_rejected_with_its_hint":
            mutant = params.params["mutant"]
            try:
                first_only.append((course.resolve(mutant.stem, ROOT), mutant))
            except LookupError:      # no such exercise: the test fails, saying so
                pass
    wanted = {}
    for exercise in swept:
        for path in files(exercise):
            wanted[path] = (exercise, True)
    for exercise, path in first_only:
        wanted.setdefault(path, (exercise, False))
    for path, (exercise, sweep) in sorted(wanted.items(),
                                          key=lambda kv: kv[0].parent.name == "mutants"):
        jobs.submit(("grade", path), grade, exercise, path, seeds(first_seed, path, sweep))


def result(config, exercise, path, first_seed, sweep=False):
    """grade()'s (report, problems) for ``path``: from the background job, or graded now (under
    every seed if ``sweep``)."""
    import background

    return background.result(config, ("grade", path), grade, exercise, path,
                             seeds(first_seed, path, sweep))
