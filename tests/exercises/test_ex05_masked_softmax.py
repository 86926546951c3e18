"""Grader of exercise 05 (lesson 05): the body of ``softmax_kernel``, a masked row softmax in Triton.

The grader launches ``softmax_kernel`` as the stub's ``masked_softmax(x, out)`` does (one program
per row), from a harness kernel of its own so that the body is what runs in every program
(through Triton's interpreter without a GPU). There a load past the end without a mask does not
fail: it returns whatever lies in memory. So every input row lives inside a larger buffer, with a row stride above BLOCK, and
the padding after each row holds large values: an unmasked load reads them (deterministically,
inside the buffer, never past the allocation) and the row's softmax comes out wrong. The output
too is a view into a buffer filled with NaN, so a store past the row, or into another row, shows.
Row lengths are not powers of two (1, 17, 97, 130, 1000), every row is compared with the float64
softmax under flashlib.testing's rule (baselines: a naive softmax in the same dtype, and
exp(x - lse) through the log-sum-exp), and probes name the mistake: no mask on the load, other=0
instead of -inf, no max subtraction, no mask on the store, a wrong row stride.
"""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashlib import runtime
from flashlib.course import checks, grading

pytestmark = pytest.mark.ex05
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ("flashlib.runtime", "flashlib.kernels.primer.launch_row_softmax")
# flashlib's own answer: removed from the copy of flashlib that `flashlib grade` shows the learner
FLASHLIB_ANSWERS = ("flashlib.kernels.primer.softmax_kernel",)

DEV = runtime.DEVICE
LENGTHS = (1, 17, 97, 130, 1000, 2100)   # 2100: longer than a hard-coded block of 1024 or 2048

HINT_LOAD_MASK = ("your kernel reads past the end of the row (its result changes with what lies "
                  "in memory after the row): load with mask=cols < n_cols and "
                  "other=float(\"-inf\")")
HINT_OTHER = ("rows are right when n_cols is a power of two but not otherwise: the tail lanes "
              "(cols >= n_cols) must load as other=float(\"-inf\"), so that they add nothing to "
              "the max and exp(-inf) = 0 adds nothing to the sum; other=0.0 adds exp(0 - max) "
              "per padded lane")
HINT_MAX = ("matches only for small inputs: exp(x) overflows past 88.72 in float32 (and "
            "underflows to 0 for very negative rows, giving 0/0): subtract the row max, "
            "z = x - tl.max(x, axis=0), before tl.exp")
HINT_STORE_MASK = ("your kernel writes past the end of the row, into memory it does not own: "
                   "store with the same mask as the load, tl.store(ptrs, y, mask=cols < n_cols)")
HINT_STRIDE = ("a wrong row stride: row 0 is right but the other rows are not. Row r starts at in_ptr + r * "
               "in_row_stride (and out_ptr + r * out_row_stride), not at r * n_cols; rows need "
               "not be contiguous")


def _softmax64(x):
    x = np.asarray(x, np.float64)
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _naive(x):
    """The baseline: exp(x - max) / sum in x's own dtype (torch, same device)."""
    z = (x - x.max(dim=-1, keepdim=True).values).exp()
    return z / z.sum(dim=-1, keepdim=True)


def _log_space(x):
    """The second baseline: exp(x - lse), lse = max + log(sum(exp(x - max))), in x's own dtype;
    its rounding follows |lse| (the rows far below 0 have |lse| in the thousands and more)."""
    m = x.max(dim=-1, keepdim=True).values
    return (x - (m + (x - m).exp().sum(dim=-1, keepdim=True).log())).exp()


def _kernel(impl):
    """The learner's softmax_kernel (``checks.jit_kernel``)."""
    return checks.jit_kernel(impl, "softmax_kernel", "ex05")


@triton.jit
def _harness(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, Ran, BLOCK: tl.constexpr,
             KERNEL: tl.constexpr):
    """The learner's kernel (KERNEL) called as Triton code, so that its body is what runs in this
    program (a torch one-liner behind ``kernel[grid]`` does not); then the program marks its
    slot of Ran."""
    KERNEL(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK)
    tl.store(Ran + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), 1)


def _launch(kernel, x, out):
    """What flashlib's launch_row_softmax does (one program per row), with the learner's kernel;
    a stub's raise (a compile error on a GPU) becomes the NotImplementedError it stands for."""
    block = triton.next_power_of_2(x.shape[1])
    ran = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    try:
        _harness[(x.shape[0],)](out, x, x.stride(0), out.stride(0), x.shape[1], ran, BLOCK=block,
                                num_warps=4 if block <= 2048 else 8, KERNEL=kernel)
    except Exception as e:
        if "NotImplementedError" in f"{type(e).__name__}: {e}":
            raise NotImplementedError("ex05: softmax_kernel's body is not written yet") from e
        raise
    checks.expect_every_program_ran(ran, "softmax_kernel", (x.shape[0],))


def _run(impl, x, *, pad=40.0, dtype=torch.float32, seed=0):
    """Run the learner's kernel (launched as the stub's masked_softmax does: the kernel is what
    is graded, whatever the launcher does) on the rows of x (NumPy,
    (rows, n_cols)) placed in padded buffers. Returns (result as float64 NumPy, the whole output
    buffer, a copy of the input view taken before the launch); fails if the kernel changed x."""
    rows, n_cols = x.shape
    block = triton.next_power_of_2(n_cols)
    extra = np.random.default_rng(seed).integers(3, 11, size=2)
    # input: row stride > BLOCK, so an unmasked load reads this row's own padding (pad), in bounds
    src = torch.full((rows + 1, block + int(extra[0])), pad, dtype=dtype, device=DEV)
    src[:rows, :n_cols] = torch.as_tensor(x, dtype=dtype, device=DEV)
    x_view = src[:rows, :n_cols]                                   # (rows, n_cols), strided rows
    # output: a different row stride, NaN everywhere the kernel must not write
    dst = torch.full((rows + 1, block + int(extra[1]) + 16), float("nan"), dtype=dtype, device=DEV)
    out_view = dst[:rows, :n_cols]
    with checks.inputs_kept("your kernel", x=x_view) as kept:
        _launch(_kernel(impl), x_view, out_view)
        if DEV.type == "cuda":
            torch.cuda.synchronize()
    return out_view.double().cpu().numpy(), dst.double().cpu().numpy(), kept["x"]


def _rows_ok(got, expected):
    return [np.allclose(g, e, rtol=1e-3, atol=1e-6) for g, e in zip(got, expected)]


def _writes_outside(dst, rows, n_cols):
    """(rows with writes past n_cols, whether anything else outside the view was written)."""
    outside = ~np.isnan(dst)
    outside[:rows, :n_cols] = False
    block = triton.next_power_of_2(n_cols)
    tail_rows = sorted(set(np.argwhere(outside[:rows, n_cols:block])[:, 0].tolist()))
    outside[:rows, n_cols:block] = False
    return tail_rows, bool(outside.any())


def _diagnose(impl):
    """Name the likely mistake from a few probes, or None."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 97))
    expected = _softmax64(x)
    got_hi, dst, _ = _run(impl, x, pad=40.0)
    got_lo, _, _ = _run(impl, x, pad=-40.0)
    ok = _rows_ok(got_hi, expected)
    if ok[0] and not all(ok[1:]):
        return HINT_STRIDE
    if not np.array_equal(got_hi, got_lo, equal_nan=True):
        return HINT_LOAD_MASK
    tail_rows, elsewhere = _writes_outside(dst, *x.shape)
    if elsewhere:
        return HINT_STRIDE
    if tail_rows:
        return HINT_STORE_MASK
    if not all(ok):
        x64 = rng.standard_normal((3, 64))
        if all(_rows_ok(_run(impl, x64)[0], _softmax64(x64))):
            return HINT_OTHER
    big = rng.uniform(100, 1000, (3, 17)) * np.array([[1.0], [-1.0], [1.0]])
    got_big = _run(impl, big)[0]
    if not np.all(np.isfinite(got_big)) or not all(_rows_ok(got_big, _softmax64(big))):
        return HINT_MAX
    return None


def _differs(got, expected):
    """Which rows and columns are wrong, when no probe names the mistake."""
    unwritten = np.isnan(got).any(axis=0)                            # (n_cols,)
    if unwritten.any() and not unwritten.all():
        first = int(np.argmax(unwritten))
        return (f"columns {first} to {got.shape[1] - 1} of these rows were never written (they "
                f"still hold the buffer's NaN): rows longer than {first} lose their tail. Use "
                "the BLOCK the launcher passes (a power of two >= n_cols) for tl.arange, not a "
                "fixed size")
    bad = ~np.isclose(got, expected, rtol=1e-3, atol=1e-6)          # (rows, n_cols)
    rows = np.flatnonzero(bad.any(axis=-1)).tolist()
    if not rows:
        return None
    r, c = rows[0], int(np.argmax(bad[rows[0]]))
    return (f"rows {rows[:8]} of {got.shape[0]} differ (row {r}, column {c}: "
            f"{float(got[r, c])!r}, expected {float(expected[r, c])!r})")


def _expect_rows(impl, x, *, dtype=torch.float32, what, hint=None):
    got, _, x_view = _run(impl, x, dtype=dtype)
    x_cast = x_view.double().cpu().numpy()                      # the values the kernel saw
    expected = _softmax64(x_cast)
    if hint is None:
        hint = lambda: _diagnose(impl) or _differs(got, expected)  # noqa: E731
    baseline = tuple(f(x_view.contiguous()).double().cpu().numpy() for f in (_naive, _log_space))
    checks.expect_close(got, expected, baseline=baseline, dtype=dtype,
                        name=f"softmax of {what} ({x.shape[0]} rows of {x.shape[1]}, {dtype})",
                        hint=hint)


def check_rows_any_length(impl, rng):
    """every row right, for rows of length 1, 17, 97, 130, 1000 and 2100 (not powers of two)"""
    for n_cols in LENGTHS:
        rows = int(rng.integers(3, 7))
        x = 2 * rng.standard_normal((rows, n_cols))
        _expect_rows(impl, x, what="random rows")


def check_writes_only_its_row(impl, rng):
    """writes exactly its row's n_cols elements: nothing past the end, nothing elsewhere"""
    for n_cols in (17, 130):
        x = rng.standard_normal((4, n_cols))
        _, dst, _ = _run(impl, x)
        tail_rows, elsewhere = _writes_outside(dst, *x.shape)
        if tail_rows:
            checks.fail(f"with n_cols={n_cols}, rows {tail_rows} were written past column "
                        f"{n_cols} (up to BLOCK={triton.next_power_of_2(n_cols)})",
                        HINT_STORE_MASK)
        if elsewhere:
            checks.fail(f"with n_cols={n_cols}, your kernel wrote outside the output rows",
                        HINT_STRIDE)


def check_negative_rows(impl, rng):
    """rows whose values are all negative (max < 0): the tail lanes must add nothing"""
    for n_cols in (17, 130):
        x = rng.standard_normal((4, n_cols)) - 8.0
        _expect_rows(impl, x, what="all-negative rows",
                     hint=lambda: _diagnose(impl) or HINT_OTHER)


def check_large_inputs(impl, rng):
    """large inputs stay finite and right (|x| up to 1000: exp overflows past 88.72)"""
    for sign in (1.0, -1.0):
        x = sign * rng.uniform(100, 1000, (4, 97))
        _expect_rows(impl, x, what=f"rows of {'large' if sign > 0 else 'very negative'} values",
                     hint=lambda: _diagnose(impl) or HINT_MAX)


def check_far_below_zero(impl, rng):
    """rows far below 0 (near -3e4, -3e9 and -1e34: the tail lanes must load as -inf, not as a
    finite stand-in such as -1e4, -1e9 or -1e30)"""
    for n_cols in (17, 130):
        for offset in (rng.uniform(2e4, 4e4), rng.uniform(2e9, 4e9), rng.uniform(0.5e34, 2e34)):
            x = -offset * (1 + 1e-3 * rng.random((4, n_cols)))     # spread: a thousandth of it
            _expect_rows(impl, x, what=f"rows near {-offset:.1g}",
                         hint=lambda: _diagnose(impl) or (
                             "the tail lanes (cols >= n_cols) must load as other=float(\"-inf\"): "
                             "a finite stand-in such as -1e4, -1e9 or -1e30 is larger than these "
                             "rows' values, so it becomes the max and the sum"))


def check_float16(impl, rng):
    """float16 rows: computed in float32, stored as float16, within float16's tolerance"""
    for n_cols in (17, 130):
        x = 3 * rng.standard_normal((5, n_cols))
        _expect_rows(impl, x, dtype=torch.float16, what="float16 rows",
                     hint=lambda: _diagnose(impl) or (
                         "compute in float32: x = tl.load(...).to(tl.float32), and store "
                         "y.to(out_ptr.dtype.element_ty)"))


CHECKS = [check_rows_any_length, check_writes_only_its_row, check_negative_rows,
          check_large_inputs, check_far_below_zero, check_float16]


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: 4096 rows of 1000 (float32) and of 3000 (float16) columns"""
    for n_cols, dtype in ((1000, torch.float32), (3000, torch.float16)):
        x = 3 * rng.standard_normal((4096, n_cols))
        _expect_rows(impl, x, dtype=dtype, what="rows on the GPU")
        tail_rows, elsewhere = _writes_outside(_run(impl, x, dtype=dtype)[1], *x.shape)
        if tail_rows or elsewhere:
            checks.fail(f"on the GPU, with n_cols={n_cols}, your kernel wrote outside the output "
                        "rows", HINT_STORE_MASK if tail_rows else HINT_STRIDE)


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex05(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex05_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
