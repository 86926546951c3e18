"""The graders are proven: every mutant (a plausible wrong answer in tests/mutants/) is rejected
by its exercise's grader with a report containing the words it declares in EXPECTED_HINT, every
reference solution passes, and every exercise has at least four mutants. Verdicts do not depend
on the seed: under seed_sweep.SEEDS seeds (tests/seed_sweep.py) every mutant is rejected and every
reference solution and correct variant (tests/variants/: the same answer written another way)
passes every check.

The grading itself (``grading.run_checks`` with the session's seed, then the other seeds) runs in
the background from the start of the session (tests/seed_sweep.py, tests/background.py); the
tests here, moved to the end of the session, assert on what it found.
"""
import ast
from pathlib import Path

import pytest

import seed_sweep
from flashlib import course
from flashlib.course import integrity

ROOT = Path(__file__).resolve().parent.parent
MUTANTS, VARIANTS = seed_sweep.MUTANTS, seed_sweep.VARIANTS
EXERCISES = course.list_exercises(ROOT)
MIN_MUTANTS = 4


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda p: p.stem)
def test_mutant_is_rejected_with_its_hint(mutant, grader_seed, request):
    expected = course.load_module(mutant).EXPECTED_HINT
    # grading.run_checks(mutant.stem, path=mutant, seed=grader_seed), run in the background
    report, _ = seed_sweep.result(request.config, course.resolve(mutant.stem, ROOT), mutant,
                                  grader_seed)
    text = report["text"]
    assert report["graded"] or report["status"] == "not accepted", \
        f"{mutant.name} was not graded:\n{text}"
    assert report["status"] != "passed" and report["passed"] < report["total"], \
        f"the grader accepts the mutant {mutant.name}:\n{text}"
    assert expected.lower() in text.lower(), \
        f"{mutant.name} is rejected, but the report lacks the hint {expected!r}:\n{text}"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_solution_passes(exercise, grader_seed, request):
    # grading.run_checks(exercise, impl="solutions", seed=grader_seed), run in the background
    report, _ = seed_sweep.result(request.config, exercise, ROOT / "solutions" / f"{exercise}.py",
                                  grader_seed)
    assert report["status"] == "passed", report["text"]


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_exercise_has_enough_mutants(exercise):
    mine = [m.name for m in MUTANTS if course.short(m.stem) == course.short(exercise)]
    assert len(mine) >= MIN_MUTANTS, f"{exercise} has {len(mine)} mutants {mine}, " \
                                     f"needs at least {MIN_MUTANTS}"


def test_every_mutant_belongs_to_an_exercise_and_declares_a_hint():
    assert MUTANTS, "tests/mutants/ is empty"
    for mutant in MUTANTS:
        assert course.resolve(mutant.stem, ROOT)  # raises for an unknown exercise number
        hint = getattr(course.load_module(mutant), "EXPECTED_HINT", None)
        assert isinstance(hint, str) and hint.strip(), f"{mutant.name} needs EXPECTED_HINT"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_verdicts_do_not_depend_on_the_seed(exercise, grader_seed, request):
    """Under seed_sweep.SEEDS seeds, every mutant is rejected and the solution and every variant
    pass (run in the background since collection: tests/seed_sweep.py)."""
    problems = [line for path in seed_sweep.files(exercise)
                for line in seed_sweep.result(request.config, exercise, path, grader_seed,
                                              sweep=True)[1]]
    assert not problems, "\n".join(problems)


def test_variants_belong_to_an_exercise():
    for variant in VARIANTS:
        assert course.resolve(variant.stem, ROOT)


@pytest.mark.parametrize("exercise", EXERCISES)
def test_graders_allow_what_the_stub_imports(exercise):
    grader = course.load_grader(exercise, ROOT)
    stub = ROOT / "exercises" / f"{exercise}.py"
    allowed = integrity.allowed_flashlib(grader, exercise, ROOT)
    assert integrity.flashlib_uses(ast.parse(stub.read_text())) <= allowed
