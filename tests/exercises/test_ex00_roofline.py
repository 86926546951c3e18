"""Grader of exercise 00 (lesson 00): roofline(flops, bytes_moved, *, peak_flops, bandwidth).

The time must be max(flops / peak_flops, bytes_moved / bandwidth) (compared in relative terms
with flashlib.testing's float64 rule) and the bound "compute" or "memory" on the right side of
the ridge point, for GPUs like an H100, an A100 and a T4 and workloads drawn at random on both
sides of it. A failure is turned into a hint by probes: a sum or min of the two times, one side
ignored, labels swapped, intensity or ridge point upside down.
"""
import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.testing import assert_close

pytestmark = pytest.mark.ex00
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()

GPUS = {"H100": (989e12, 3.35e12), "A100": (312e12, 2.0e12), "T4": (65e12, 0.32e12)}


def _gpu(rng):
    """(name, peak_flops, bandwidth) of a GPU, jittered so no answer can be memorised."""
    name = list(GPUS)[rng.integers(len(GPUS))]
    peak, bandwidth = GPUS[name]
    return name, peak * rng.uniform(0.8, 1.2), bandwidth * rng.uniform(0.8, 1.2)


def _call(impl, flops, nbytes, peak, bandwidth):
    roofline = checks.function(impl, "roofline")
    result = roofline(float(flops), float(nbytes), peak_flops=float(peak),
                      bandwidth=float(bandwidth))
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        checks.fail(f"roofline returned {result!r}; it should return a pair (seconds, bound)")
    seconds, bound = result
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        checks.fail(f"the time should be a number of seconds, got {seconds!r}")
    if bound not in ("compute", "memory"):
        checks.fail(f"the bound should be exactly 'compute' or 'memory', got {bound!r}")
    return seconds, bound


def _close(a, b):
    return abs(a - b) <= 1e-9 * abs(b)


def _time_hint(seconds, compute_time, memory_time):
    if _close(seconds, compute_time + memory_time):
        return ("your time is the compute time plus the memory time: a GPU loads data while it "
                "computes, so the two overlap and the work takes the larger of them (max)")
    if _close(seconds, min(compute_time, memory_time)):
        return ("your time is the smaller of the two times: the work cannot finish before its "
                "slower part does, so take the max")
    if _close(seconds, compute_time):
        return ("you returned the compute time flops / peak_flops, but here moving the bytes "
                "takes longer: the time is max(flops / peak_flops, bytes_moved / bandwidth)")
    if _close(seconds, memory_time):
        return ("you returned the memory time bytes_moved / bandwidth, but here the math takes "
                "longer: the time is max(flops / peak_flops, bytes_moved / bandwidth)")
    return "the least time is max(flops / peak_flops, bytes_moved / bandwidth), in seconds"


def _label_hint(impl, rng):
    """Classify wrong labels over intensities from 1e-5 to 1e6 flop/B on one GPU."""
    _, peak, bandwidth = _gpu(rng)
    ridge = peak / bandwidth
    regions = {"low": [], "middle": [], "high": []}   # below 1/ridge, below ridge, above ridge
    answers = set()
    for intensity in 10.0 ** (np.linspace(-5, 6, 45) + rng.uniform(-0.05, 0.05)):
        if min(abs(np.log(intensity / ridge)), abs(np.log(intensity * ridge))) < 0.05:
            continue  # too close to a boundary to classify
        flops = rng.uniform(1e9, 1e13)
        _, bound = _call(impl, flops, flops / intensity, peak, bandwidth)
        answers.add(bound)
        right = "compute" if intensity > ridge else "memory"
        region = "high" if intensity > ridge else "middle" if intensity > 1 / ridge else "low"
        regions[region].append(bound == right)
    wrong = {r: not all(ok) for r, ok in regions.items()}
    if len(answers) == 1:
        return (f"you always answer {answers.pop()!r}: compare the two times; the larger one "
                "names the bound")
    if all(not any(ok) for ok in regions.values()):
        return ("your labels are swapped: when the math takes longer (flops / peak_flops > "
                "bytes_moved / bandwidth) the work is compute-bound; when the bytes take "
                "longer it is memory-bound")
    if wrong["low"] and wrong["high"] and not wrong["middle"]:
        return ("arithmetic intensity is flops per byte (flops / bytes_moved), not bytes per "
                "flop: a big matmul does hundreds of flops per byte and is compute-bound")
    if wrong["middle"] and not wrong["low"] and not wrong["high"]:
        return (f"you call work compute-bound below the ridge point: the ridge point is "
                f"peak_flops / bandwidth (about {ridge:.0f} flop/B here), not its inverse; "
                "work with fewer flops per byte than that is memory-bound")
    return ("the bound is 'compute' exactly when flops / peak_flops > bytes_moved / bandwidth "
            "(intensity flops / bytes_moved above the ridge point peak_flops / bandwidth)")


def _expect(impl, rng, flops, nbytes, peak, bandwidth, what):
    compute_time, memory_time = flops / peak, nbytes / bandwidth
    seconds, bound = _call(impl, flops, nbytes, peak, bandwidth)
    right = "compute" if compute_time > memory_time else "memory"
    call = (f"roofline({flops:.3g}, {nbytes:.3g}, peak_flops={peak:.3g}, "
            f"bandwidth={bandwidth:.3g}) ({what}, {flops / nbytes:.3g} flop/B)")
    if bound != right:
        checks.fail(f"{call} says {bound!r}, expected {right!r}", _label_hint(impl, rng))
    expected = max(compute_time, memory_time)
    # another correct route (through the intensity) in float64 sets the rounding allowed
    baseline = flops / min(peak, flops / nbytes * bandwidth)
    try:
        assert_close(np.float64(seconds / expected), np.float64(1.0),
                     baseline=np.float64(baseline / expected), dtype=np.float64)
    except AssertionError:
        checks.fail(f"{call} returned {seconds:.6g} s, expected {expected:.6g} s",
                    _time_hint(seconds, compute_time, memory_time))


def check_memory_bound(impl, rng):
    """an elementwise add (0.08 flop/B) is memory-bound, and its time is right"""
    name, peak, bandwidth = _gpu(rng)
    n = int(rng.integers(10**6, 10**9))
    _expect(impl, rng, n, 12 * n, peak, bandwidth, f"float32 c = a + b on {name}")


def check_compute_bound(impl, rng):
    """a large matmul (hundreds of flop/B) is compute-bound, and its time is right"""
    name, peak, bandwidth = _gpu(rng)
    M, N, K = (int(x) for x in rng.integers(2048, 8193, size=3))
    flops, nbytes = 2 * M * N * K, 2 * (M * K + K * N + M * N)
    _expect(impl, rng, flops, nbytes, peak, bandwidth, f"fp16 {M}x{K} @ {K}x{N} on {name}")


def check_both_sides(impl, rng):
    """random work on both sides of the ridge point: time and bound"""
    for _ in range(20):
        name, peak, bandwidth = _gpu(rng)
        intensity = 10.0 ** rng.uniform(-3, 4)
        if abs(np.log(intensity * bandwidth / peak)) < 0.05:
            continue  # at the ridge either label is right
        flops = 10.0 ** rng.uniform(6, 15)
        _expect(impl, rng, flops, flops / intensity, peak, bandwidth, f"on {name}")


def check_labels_everywhere(impl, rng):
    """the bound is right for intensities from 0.00001 to 1000000 flop/B"""
    _, peak, bandwidth = _gpu(rng)
    for intensity in 10.0 ** (np.linspace(-5, 6, 23) + rng.uniform(-0.2, 0.2)):
        if abs(np.log(intensity * bandwidth / peak)) < 0.05:
            continue
        flops = 10.0 ** rng.uniform(6, 15)
        _, bound = _call(impl, flops, flops / intensity, peak, bandwidth)
        right = "compute" if intensity > peak / bandwidth else "memory"
        if bound != right:
            checks.fail(f"{intensity:.3g} flop/B on a GPU whose ridge point is "
                        f"{peak / bandwidth:.0f} flop/B: you say {bound!r}, expected {right!r}",
                        _label_hint(impl, rng))


CHECKS = [check_memory_bound, check_compute_bound, check_both_sides, check_labels_everywhere]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex00(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
