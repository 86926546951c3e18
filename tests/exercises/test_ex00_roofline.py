"""Grader of exercise 00 (lessons 00 and 05): roofline(flops, bytes_moved, *, peak_flops,
bandwidth) and occupancy(num_warps, registers_per_thread, shared_bytes, sm).

roofline: the time must be max(flops / peak_flops, bytes_moved / bandwidth) (compared in relative
terms with flashlib.testing's float64 rule) and the bound "compute" or "memory" on the right side
of the ridge point, for GPUs like an H100, an A100 and a T4 and workloads drawn at random on both
sides of it. Every random workload lies at least MARGIN decades (a factor 1.26) from the ridge
point, so no verdict depends on the seed through a workload too close to call. A failure is
turned into a hint by probes: a sum or min of the two times, one side ignored, labels swapped,
intensity or ridge point upside down.

occupancy: (blocks_per_sm, occupancy, limits) by the CUDA occupancy calculator's rules (the
stub's docstring), against this file's own reference: hand-computed kernels on an H100, an A100,
an L4 and a T4, each chosen so that one rule decides (register allocation unit, sub-partitions,
per-SM against per-block shared memory, the 1 KB reserve, the shared-memory unit, the warp and
block slots, kernels that cannot launch), so every mistake is caught whatever the seed; then
random kernels, and a made-up GPU whose figures differ from every real one. A wrong limit is
diagnosed by recomputing it under each common mistake and naming the one that matches.
"""
import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.testing import assert_close

pytestmark = pytest.mark.ex00
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own occupancy calculator: a call from the learner's file is "not accepted"
FLASHLIB_ANSWERS = ("flashlib.teach.profile.occupancy",)

GPUS = {"H100": (989e12, 3.35e12), "A100": (312e12, 2.0e12), "T4": (65e12, 0.32e12)}
# random workloads keep at least this many decades (log10) from the ridge point (and, for the
# hint's probes, from its inverse): at the ridge either label is right, and near it a correct
# answer computed another way (through the intensity) may round to the other side
MARGIN = 0.1


def _clear(log_intensity, *boundaries):
    """log10 of an intensity moved, if it lies within MARGIN of a boundary (a log10), to MARGIN
    from it on the same side: the number of cases and their sides stay as drawn."""
    for b in boundaries:
        if abs(log_intensity - b) < MARGIN:
            log_intensity = b + (MARGIN if log_intensity >= b else -MARGIN)
    return log_intensity


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
    for u in np.linspace(-5, 6, 45) + rng.uniform(-0.05, 0.05):
        intensity = 10.0 ** _clear(u, np.log10(ridge), -np.log10(ridge))
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
    for i in range(20):
        name, peak, bandwidth = _gpu(rng)
        side = 1 if i % 2 else -1                  # ten workloads on each side of the ridge
        intensity = peak / bandwidth * 10.0 ** (side * rng.uniform(MARGIN, 3.5))
        flops = 10.0 ** rng.uniform(6, 15)
        _expect(impl, rng, flops, flops / intensity, peak, bandwidth, f"on {name}")


def check_labels_everywhere(impl, rng):
    """the bound is right for intensities from 0.00001 to 1000000 flop/B"""
    _, peak, bandwidth = _gpu(rng)
    for u in np.linspace(-5, 6, 23) + rng.uniform(-0.2, 0.2):
        intensity = 10.0 ** _clear(u, np.log10(peak / bandwidth))
        flops = 10.0 ** rng.uniform(6, 15)
        _, bound = _call(impl, flops, flops / intensity, peak, bandwidth)
        right = "compute" if intensity > peak / bandwidth else "memory"
        if bound != right:
            checks.fail(f"{intensity:.3g} flop/B on a GPU whose ridge point is "
                        f"{peak / bandwidth:.0f} flop/B: you say {bound!r}, expected {right!r}",
                        _label_hint(impl, rng))


# ---------------------------------------------------------------------------------------------
# part 2: occupancy (lesson 05)

# per-SM limits as the stub gives them (NVIDIA's specifications; the stub's H100, A100, L4, T4)
SMS = {
    "H100": dict(name="H100 / H200 (sm90)", registers_per_sm=65536, register_unit=256, sub_partitions=4,
                 max_warps_per_sm=64, max_blocks_per_sm=32, shared_per_sm=228 * 1024,
                 shared_per_block=227 * 1024, reserved_shared_per_block=1024, shared_unit=128),
    "A100": dict(name="A100 (sm80)", registers_per_sm=65536, register_unit=256, sub_partitions=4,
                 max_warps_per_sm=64, max_blocks_per_sm=32, shared_per_sm=164 * 1024,
                 shared_per_block=163 * 1024, reserved_shared_per_block=1024, shared_unit=128),
    "L4": dict(name="L4 (sm89)", registers_per_sm=65536, register_unit=256, sub_partitions=4,
               max_warps_per_sm=48, max_blocks_per_sm=24, shared_per_sm=100 * 1024,
               shared_per_block=99 * 1024, reserved_shared_per_block=1024, shared_unit=128),
    "T4": dict(name="T4 (sm75)", registers_per_sm=65536, register_unit=256, sub_partitions=4,
               max_warps_per_sm=32, max_blocks_per_sm=16, shared_per_sm=64 * 1024,
               shared_per_block=64 * 1024, reserved_shared_per_block=0, shared_unit=256),
}
# a GPU that does not exist, every figure unlike the real ones: catches limits typed in as numbers
MADE_UP = dict(name="made-up GPU", registers_per_sm=98304, register_unit=512, sub_partitions=2,
               max_warps_per_sm=40, max_blocks_per_sm=12, shared_per_sm=300 * 1024,
               shared_per_block=298 * 1024, reserved_shared_per_block=2048, shared_unit=512)
LIMIT_KEYS = ("registers", "shared memory", "warps", "blocks")


def _up(x, unit):
    return -(-x // unit) * unit


def _down(x, unit):
    return x // unit * unit


def _cdiv(a, b):
    return -(-a // b)


# Each limit under the rules (first entry) and under each common mistake, with the hint that
# names the mistake; a limit is fn(num_warps, registers, shared, sm) -> blocks.
def _registers_rule(w, r, s, sm, unit_round=_up, divide=lambda a, b: a // b, parts=True):
    per_warp = unit_round(r * 32, sm["register_unit"])
    if per_warp == 0:
        return None
    if parts:
        warps = sm["sub_partitions"] * divide(sm["registers_per_sm"] // sm["sub_partitions"], per_warp)
    else:
        warps = divide(sm["registers_per_sm"], per_warp)
    return divide(warps, w)


def _shared_rule(w, r, s, sm, total="shared_per_sm", reserve=True, unit=True,
                 divide=lambda a, b: a // b):
    need = s + (sm["reserved_shared_per_block"] if reserve else 0)
    need = _up(need, sm["shared_unit"]) if unit else need
    return divide(sm[total], need) if need else sm["max_blocks_per_sm"]


ROUND_DOWN = ("blocks that fit are a division rounded down (part of a block does not run), while "
              "an allocation is rounded up (a warp asking for 3200 registers is given 3328)")
MISTAKES = {
    "registers": [
        (lambda w, r, s, sm: _registers_rule(w, r, s, sm, unit_round=_down, divide=_cdiv),
         "you have the rounding the other way round: " + ROUND_DOWN),
        (lambda w, r, s, sm: _registers_rule(w, r, s, sm, unit_round=lambda x, u: x),
         "round each warp's registers (registers_per_thread x 32) up to a multiple of "
         "sm['register_unit'] (256): the SM hands registers to a warp in chunks of 256, so a "
         "warp of 100-register threads takes 3328, not 3200"),
        (lambda w, r, s, sm: _registers_rule(w, r, s, sm, parts=False),
         "the register file is split into sm['sub_partitions'] (4) equal parts and a warp takes "
         "all its registers from one part: warps per part = (registers_per_sm / sub_partitions) "
         "// registers per warp, then x sub_partitions; dividing the whole file can count a warp "
         "made of leftovers from several parts"),
        (lambda w, r, s, sm: sm["registers_per_sm"] // (r * 32 * w),
         "registers are allocated per warp, rounded up to a multiple of sm['register_unit'] (256), "
         "from one of sm['sub_partitions'] (4) parts of the register file: see the docstring's "
         "rule, not registers_per_sm // (registers per block)"),
        (lambda w, r, s, sm: _registers_rule(w, r, s, sm, divide=_cdiv),
         ROUND_DOWN + ": use // for the warps per part and the blocks"),
    ],
    "shared memory": [
        (lambda w, r, s, sm: _shared_rule(w, r, s, sm, total="shared_per_block"),
         "divide what the whole SM holds, sm['shared_per_sm'] (228 KB on an H100), not "
         "sm['shared_per_block'] (227 KB): that is the most one block may ask for, not the "
         "SM's shared memory (four 57 KB blocks fit in 228 KB)"),
        (lambda w, r, s, sm: _shared_rule(w, r, s, sm, reserve=False),
         "add sm['reserved_shared_per_block'] (1 KB on an H100) to each block's shared memory: "
         "the CUDA runtime keeps that much per block, so two 114 KB blocks do not fit in 228 KB"),
        (lambda w, r, s, sm: _shared_rule(w, r, s, sm, unit=False),
         "round each block's shared memory (with the reserve) up to a multiple of "
         "sm['shared_unit']: it is allocated in chunks of that size"),
        (lambda w, r, s, sm: _shared_rule(w, r, s, sm, divide=_cdiv),
         ROUND_DOWN + ": use // for the blocks that fit"),
        (lambda w, r, s, sm: _shared_rule(w, r, s, sm, total="shared_per_block", reserve=False),
         "divide sm['shared_per_sm'] (what the SM holds, not the per-block maximum) by the "
         "block's shared memory plus sm['reserved_shared_per_block'] (the runtime's 1 KB)"),
    ],
    "warps": [
        (lambda w, r, s, sm: sm["max_warps_per_sm"] * 32 // w,
         "the warps limit counts warps: sm['max_warps_per_sm'] // num_warps, not threads // warps"),
        (lambda w, r, s, sm: _cdiv(sm["max_warps_per_sm"], w), ROUND_DOWN + ": use //"),
    ],
    "blocks": [],
}
LIMIT_HINTS = {
    "registers": "registers: warps per part = (registers_per_sm // sub_partitions) // (registers_"
                 "per_thread x 32 rounded up to register_unit); blocks = warps per part x "
                 "sub_partitions // num_warps",
    "shared memory": "shared memory: blocks = shared_per_sm // (shared_bytes + reserved_shared_per_"
                     "block, rounded up to shared_unit); sm['max_blocks_per_sm'] if that is 0",
    "warps": "an SM has sm['max_warps_per_sm'] warp slots (64 on an H100), so it holds at most "
             "max_warps_per_sm // num_warps blocks, whatever their registers and shared memory",
    "blocks": "an SM holds at most sm['max_blocks_per_sm'] blocks (32 on an H100), however small",
}


def _reference(num_warps, registers, shared, sm):
    limits = {"registers": _registers_rule(num_warps, registers, shared, sm),
              "shared memory": _shared_rule(num_warps, registers, shared, sm),
              "warps": sm["max_warps_per_sm"] // num_warps, "blocks": sm["max_blocks_per_sm"]}
    blocks = min(limits.values())
    return blocks, blocks * num_warps / sm["max_warps_per_sm"], limits


def _whole(value, what, call):
    """value as an int, or a failure: the limits and blocks are whole numbers of blocks."""
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        checks.fail(f"{call}: {what} should be a whole number of blocks, got {value!r}")
    if as_float != int(as_float):
        checks.fail(f"{call}: {what} is {value!r}, not a whole number of blocks",
                    ROUND_DOWN + ": use //, which rounds down")
    return int(as_float)


def _expect_occupancy(impl, what, num_warps, registers, shared, sm):
    """Call the learner's occupancy on one kernel and compare everything it returns."""
    occupancy = checks.function(impl, "occupancy")
    call = (f"occupancy(num_warps={num_warps}, registers_per_thread={registers}, "
            f"shared_bytes={shared}, sm={sm['name']}) ({what})")
    result = occupancy(num_warps, registers, shared, dict(sm))
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        checks.fail(f"{call} returned {result!r}; it should return (blocks_per_sm, occupancy, limits)")
    blocks, fraction, limits = result
    expected_blocks, expected_fraction, expected_limits = _reference(num_warps, registers, shared, sm)
    if not isinstance(limits, dict):
        checks.fail(f"{call}: limits should be a dict, got {type(limits).__name__}")
    for key in LIMIT_KEYS:
        if key not in limits:
            checks.fail(f"{call}: your limits have no {key!r} entry", LIMIT_HINTS[key])
    extra = sorted(set(limits) - set(LIMIT_KEYS), key=str)
    if extra:
        checks.fail(f"{call}: limits should have exactly the keys {list(LIMIT_KEYS)}; yours also "
                    f"has {extra}")
    for key in LIMIT_KEYS:
        got = _whole(limits[key], f"limits[{key!r}]", call)
        if got != expected_limits[key]:
            hint = next((h for model, h in MISTAKES[key]
                         if model(num_warps, registers, shared, sm) == got), LIMIT_HINTS[key])
            checks.fail(f"{call}: limits[{key!r}] is {got}, expected {expected_limits[key]}", hint)
    blocks = _whole(blocks, "blocks_per_sm", call)
    if blocks != expected_blocks:
        left_out = [k for k in LIMIT_KEYS if min(v for j, v in expected_limits.items() if j != k) == blocks]
        if blocks == max(expected_limits.values()):
            hint = "blocks_per_sm is the smallest of the four limits (every one must hold), not the largest"
        elif left_out:
            hint = (f"blocks_per_sm is the smallest of all four limits; yours leaves out the "
                    f"{left_out[0]!r} limit")
        else:
            hint = "blocks_per_sm is min(limits.values()): every limit must hold at once"
        checks.fail(f"{call}: blocks_per_sm is {blocks}, expected {expected_blocks} "
                    f"(limits {expected_limits})", hint)
    try:
        fraction = float(fraction)
    except (TypeError, ValueError):
        checks.fail(f"{call}: occupancy should be a number, got {fraction!r}")
    if not abs(fraction - expected_fraction) <= 1e-12 * max(1.0, expected_fraction):
        max_warps, max_blocks = sm["max_warps_per_sm"], sm["max_blocks_per_sm"]
        if abs(fraction - blocks / max_blocks) <= 1e-12:
            hint = ("occupancy counts warps, not blocks: blocks_per_sm x num_warps / "
                    "sm['max_warps_per_sm'], the fraction of the SM's warp slots in use")
        elif abs(fraction - 100 * expected_fraction) <= 1e-9 * max(1.0, 100 * expected_fraction):
            hint = "occupancy is a fraction between 0 and 1, not a percentage"
        else:
            hint = (f"occupancy = blocks_per_sm x num_warps / sm['max_warps_per_sm'] (resident "
                    f"warps over the SM's {max_warps} warp slots)")
        checks.fail(f"{call}: occupancy is {fraction:.6g}, expected {expected_fraction:.6g}", hint)


# (what it tests, num_warps, registers per thread, shared bytes, GPU): each case is decided by the
# rule it names, so each common mistake fails one of them whatever the seed
WORKED_EXAMPLES = [
    ("the docstring's example: registers and shared memory both allow 3", 4, 168, 64 * 1024, "H100"),
    ("3200 registers a warp are allocated as 3328", 4, 100, 0, "H100"),
    ("80-register warps: 6 fit in each of the 4 parts of the register file", 1, 80, 2048, "H100"),
    ("four 56 KB blocks (57 KB with the reserve) fill the SM's 228 KB", 4, 32, 56 * 1024, "H100"),
    ("two 114 KB blocks do not fit with their 1 KB reserves", 8, 128, 114 * 1024, "H100"),
    ("few registers, no shared memory: the 64 warp slots bind", 4, 24, 0, "H100"),
    ("1-warp blocks: the 32 block slots bind", 1, 16, 0, "H100"),
    ("16 warps of 255 registers need more than the register file: 0 blocks", 16, 255, 16 * 1024, "H100"),
    ("228 KB of shared memory is over the 227 KB a block may use: 0 blocks", 4, 64, 228 * 1024, "H100"),
    ("an A100: 164 KB of shared memory per SM", 4, 128, 80 * 1024, "A100"),
    ("an L4: 48 warp slots and 24 block slots", 8, 96, 32 * 1024, "L4"),
    ("a T4: no reserve before sm80, so a block without shared memory needs none", 4, 32, 0, "T4"),
    ("a T4: shared memory in 256-byte units (21800 bytes take 22016)", 4, 40, 21800, "T4"),
]


def check_occupancy_worked_examples(impl, rng):
    """occupancy: 13 hand-checked kernels on an H100, an A100, an L4 and a T4, each decided by one rule"""
    for what, num_warps, registers, shared, gpu in WORKED_EXAMPLES:
        _expect_occupancy(impl, what, num_warps, registers, shared, SMS[gpu])


def _random_kernel(rng, sm):
    num_warps = int(2 ** rng.integers(0, 6))                  # 1 to 32 warps (1024 threads)
    registers = int(rng.integers(16, 256))
    shared = int(rng.choice([0, int(rng.integers(1, sm["shared_per_sm"] + 4096))]))
    return num_warps, registers, shared


def check_occupancy_random_kernels(impl, rng):
    """occupancy: 40 random kernels (1-32 warps, 16-255 registers, shared memory up to the SM's and past it) on the four GPUs"""
    for _ in range(40):
        gpu = list(SMS)[rng.integers(len(SMS))]
        _expect_occupancy(impl, "random kernel", *_random_kernel(rng, SMS[gpu]), SMS[gpu])


def _right_on(impl, kernel, sm):
    try:
        _expect_occupancy(impl, "", *kernel, sm)
        return True
    except checks.CheckFailed:
        return False


def check_occupancy_reads_sm(impl, rng):
    """occupancy: a made-up GPU whose every figure differs from the real ones (all read from sm)"""
    kernels = [case[1:4] for case in WORKED_EXAMPLES[:9]] + [_random_kernel(rng, MADE_UP) for _ in range(20)]
    for kernel in kernels:
        try:
            _expect_occupancy(impl, "a made-up GPU", *kernel, MADE_UP)
        except checks.CheckFailed as e:
            if not _right_on(impl, kernel, SMS["H100"]):
                raise       # wrong on a real GPU too: the hint above says why
            figures = ", ".join(f"{k}={v}" for k, v in MADE_UP.items() if k != "name")
            what = str(e).split("\n    hint:")[0]     # the mistake models assume the real figures
            checks.fail(f"{what} (right for this kernel on an H100)",
                        f"read every limit from sm, none typed in as a number: here {figures}")


CHECKS = [check_memory_bound, check_compute_bound, check_both_sides, check_labels_everywhere,
          check_occupancy_worked_examples, check_occupancy_random_kernels, check_occupancy_reads_sm]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex00(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
