"""The graders are proven: every mutant (a plausible wrong answer in tests/mutants/) is rejected
by its exercise's grader with a report containing the words it declares in EXPECTED_HINT, every
reference solution passes, and every exercise has at least four mutants. Verdicts do not depend
on the seed: under SEEDS seeds every mutant is rejected and every reference solution and correct
variant (tests/variants/: the same answer written another way) passes every check."""
import ast
from pathlib import Path

import pytest

from flashlib import grading

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = sorted((ROOT / "tests" / "mutants").glob("ex[0-9]*_*.py"))
VARIANTS = sorted((ROOT / "tests" / "variants").glob("ex[0-9]*_*.py"))
SEEDS = 20
EXERCISES = grading.list_exercises(ROOT)
MIN_MUTANTS = 4


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda p: p.stem)
def test_mutant_is_rejected_with_its_hint(mutant, grader_seed):
    expected = grading.load_module(mutant).EXPECTED_HINT
    report = grading.run_checks(mutant.stem, path=mutant, seed=grader_seed, root=ROOT)
    text = grading.format_report(report)
    assert report.results or report.status == "not accepted", f"{mutant.name} was not graded:\n{text}"
    assert report.status != "passed" and report.passed < report.total, \
        f"the grader accepts the mutant {mutant.name}:\n{text}"
    assert expected.lower() in text.lower(), \
        f"{mutant.name} is rejected, but the report lacks the hint {expected!r}:\n{text}"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_solution_passes(exercise, grader_seed):
    report = grading.run_checks(exercise, impl="solutions", seed=grader_seed, root=ROOT)
    assert report.status == "passed", grading.format_report(report)


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_exercise_has_enough_mutants(exercise):
    mine = [m.name for m in MUTANTS if grading.short(m.stem) == grading.short(exercise)]
    assert len(mine) >= MIN_MUTANTS, f"{exercise} has {len(mine)} mutants {mine}, " \
                                     f"needs at least {MIN_MUTANTS}"


def test_every_mutant_belongs_to_an_exercise_and_declares_a_hint():
    assert MUTANTS, "tests/mutants/ is empty"
    for mutant in MUTANTS:
        assert grading.resolve(mutant.stem, ROOT)  # raises for an unknown exercise number
        hint = getattr(grading.load_module(mutant), "EXPECTED_HINT", None)
        assert isinstance(hint, str) and hint.strip(), f"{mutant.name} needs EXPECTED_HINT"


def _mine(files, exercise):
    return [f for f in files if grading.exercise_number(f.stem) == grading.exercise_number(exercise)]


@pytest.mark.parametrize("exercise", EXERCISES)
def test_verdicts_do_not_depend_on_the_seed(exercise, grader_seed):
    """Each file loaded once; per seed, a mutant must fail some check (the first failure ends its
    seed) and the solution and every variant must pass every check."""
    grader = grading.load_grader(exercise, ROOT)
    allowed = grading.allowed_flashlib(grader, exercise, ROOT)
    seeds = [grader_seed + 7919 * i for i in range(SEEDS)]
    problems = []
    correct = [ROOT / "solutions" / f"{exercise}.py", *_mine(VARIANTS, exercise)]
    for path in _mine(MUTANTS, exercise) + correct:
        why = grading.borrowed(ast.parse(path.read_text()), allowed)
        with grading.tripwire(getattr(grader, "FLASHLIB_ANSWERS", ()), path):
            module = None if why else grading.load_module(path)
        why = why or grading.foreign(module, allowed, ROOT)
        if path in correct:
            assert why is None, f"{path.name} is refused: {why}"
        elif why is not None:
            continue                                     # refused whatever the seed
        for seed in seeds:
            for check in grader.CHECKS:
                result = grading.run_one(check, module, seed)
                if path not in correct and result.status != "ok":
                    break
                if path in correct and result.status != "ok":
                    problems.append(f"{path.name} fails {check.__name__} with seed {seed}: "
                                    f"{result.message.splitlines()[0]}")
            else:
                if path not in correct:
                    problems.append(f"{path.name} is accepted with seed {seed}")
    assert not problems, "\n".join(problems)


def test_variants_belong_to_an_exercise():
    for variant in VARIANTS:
        assert grading.resolve(variant.stem, ROOT)


@pytest.mark.parametrize("exercise", EXERCISES)
def test_graders_allow_what_the_stub_imports(exercise):
    grader = grading.load_grader(exercise, ROOT)
    stub = ROOT / "exercises" / f"{exercise}.py"
    allowed = grading.allowed_flashlib(grader, exercise, ROOT)
    assert grading.flashlib_uses(ast.parse(stub.read_text())) <= allowed
