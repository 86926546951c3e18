"""Grader of exercise 05b (lesson 05): four Triton puzzles, one check each, then the kernels
again with other block sizes, float16 attention rows with large scores, and every load checked
to stay inside its tensor.

The grader launches the learner's four ``@triton.jit`` kernels itself (``add_kernel``,
``copy_tile_kernel``, ``matmul_tile_kernel``, ``attention_row_kernel``, with the grids and
arguments of the stub's launchers; the learner's launchers are not used, so a launcher rewired to
torch cannot stand in for its kernel), through Triton's interpreter without a GPU. It launches
them from inside harness kernels of its own, which call the learner's function as Triton code in
every program and then mark the program as run: what runs is the function's body, not whatever
the kernel object's ``run`` was replaced by (a torch one-liner behind ``kernel[grid]``), and a
launch whose programs did not all run fails. There a load
past the end without a mask does not fail, it returns whatever lies in memory; so every input is
a view into a larger buffer whose other elements hold a pad value (an unmasked load reads them,
in bounds), and every output is a view into a buffer of NaN, so a store past the end or at a
wrong stride shows. A load whose values are thrown away (a tail lane never stored, a padded key
scored -inf) is invisible in the results: one check records, through the interpreter, the
address of every element each load reads and fails on any outside the tensors (not under
``flashlib grade``, whose learner's kernels run in another process). The views are not
contiguous (every other element, padded rows, transposed views, every other column), the lengths
are not multiples of the blocks (1, 17, 97, 130; head dim 80 and 33), and results are compared
with float64 under flashlib.testing's rule. When a check fails,
probes name the mistake: a missing tail mask, a stride ignored (contiguous assumed), float16
accumulation in the matmul, padded score lanes that are not -inf, no max subtraction, a tile
shape that holds only for the stub's block sizes, scores computed in float16, loads left unmasked.
"""
import contextlib
import inspect
import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashlib.course import checks, grading
from flashlib import runtime
from flashlib.kernels.primer import matmul_kernel as library_matmul
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex05b
# flashlib's own answer, removed from the copy of flashlib that `flashlib grade` shows the learner
# (a call from the learner's file while graded is "not accepted"): lesson 05's tiled matmul, puzzle
# (c) with a grid of its own. The GPU check's tensor-core baseline runs it here, imported above.
FLASHLIB_ANSWERS = ("flashlib.kernels.primer.matmul_kernel",)

DEV = runtime.DEVICE
SPILL = 64           # room after each view for the lanes of a block that sticks out (block <= 64)

HINT_TAIL = ("the last block sticks out past the end and your kernel writes there: mask the "
             "store (and the loads) with the lanes that are inside, e.g. mask = offs < n")
HINT_STRIDE_1D = ("right for contiguous vectors but not for strided ones: element i of x is at "
                  "x_ptr + i * stride_x (likewise y and out); do not assume stride 1")
HINT_2D_MASK = ("your kernel writes outside the matrix where a tile sticks out past row M or "
                "column N: mask both axes, (rows[:, None] < M) & (cols[None, :] < N), on the load "
                "and the store")
HINT_STRIDE_2D = ("right for a contiguous matrix only: the row stride is ignored or the layout "
                  "assumed contiguous. Element (m, n) is at x_ptr + m * stride_xm + n * stride_xn, "
                  "and a transposed view has stride_xm = 1; use every stride you are given")
HINT_K_TAIL = ("the result depends on what lies past the end of A or B along K: when K is not a "
               "multiple of BLOCK_K, mask the loads with k < K and other=0.0 (a zero adds nothing "
               "to a dot product)")
HINT_FP16_ACC = ("right for float32 inputs but off by float16 rounding for float16 inputs: "
                 "accumulate in float32, acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), "
                 "acc = tl.dot(a, b, acc), and convert only when storing")
HINT_PAD_SCORE = ("right when n_keys is a power of two but not otherwise: the lanes j >= n_keys "
                  "are no keys; their scores must be -inf (not 0, and not a finite stand-in such "
                  "as -1e4 or -1e9: real scores can be lower still), e.g. "
                  "s = tl.where(keys < n_keys, s, float(\"-inf\")), so that exp gives them "
                  "probability 0")
HINT_MAX = ("matches only for small scores: exp overflows past 88.72 in float32 (inf/inf = NaN): "
            "subtract the max score, p = tl.exp(s - tl.max(s, axis=0)), before dividing by the sum; "
            "s is the scaled score, and the max subtracted must be the max of that same s (with "
            "exp(scale * s - max(s)) the exponents are off by (1 - scale) max(s))")
HINT_BLOCK_K = ("right with block_k=32 only: the K lanes of a tile are tl.arange(0, BLOCK_K), "
                "and the loop steps by BLOCK_K; use the BLOCK_K the launcher passes, never a "
                "fixed width")
HINT_BLOCKS = ("right with the stub's block sizes only: every shape in a kernel comes from its "
               "own constexpr, whatever the others are: the matmul's acc is (BLOCK_M, BLOCK_N), "
               "A's tile (BLOCK_M, BLOCK_K), B's (BLOCK_K, BLOCK_N); lanes are "
               "tl.arange(0, BLOCK) of the matching block, and BLOCK_N, BLOCK_D may exceed "
               "n_keys, d by more than the next power of two")
HINT_FP16 = ("right for float32 inputs and for float16 with small scores, not for float16 with "
             "scores in the hundreds: float16 keeps 11 bits, so a score near 300 is rounded by "
             "0.125 and p = exp(s - max) by about 12%. Convert the loaded tiles to float32 "
             "(q = tl.load(...).to(tl.float32), likewise K and V) before the products, sums and "
             "exp, and convert only the stored o")
HINT_READS = {
    "add_kernel": "Mask the loads as well as the store: x and y with mask=offs < n",
    "copy_tile_kernel": "Mask the load with the same 2-D mask as the store",
    "matmul_tile_kernel": ("Mask each tile on both its axes: A's with (rows < M) & (k < K), B's "
                           "with (k < K) & (cols < N)"),
    "attention_row_kernel": ("Mask K and V on both axes, keys < n_keys and dims < d (and q on "
                             "dims < d): a padded key lane's score is set to -inf afterwards, but "
                             "its load still reads past K and V"),
}
READS_WHY = ("A load reads outside its tensor, although the values it reads there are thrown "
             "away (never stored, or scored -inf): on a GPU that is past the end of the "
             "allocation (an illegal address) or another tensor's data. ")
HINT_D_MASK = ("your kernel writes past the head dim d (up to BLOCK_D) or outside the output "
               "rows: store o with mask=dims < d at o_ptr + i * stride_om + dims * stride_od")


# ---- the learner's kernels, launched by the grader ---------------------------------------------

KERNELS = {"add_kernel": 8, "copy_tile_kernel": 10, "matmul_tile_kernel": 15,
           "attention_row_kernel": 17}         # name: the stub's number of parameters
_READS = None     # while check_reads_inside runs: a list each launch appends (kernel, stray) to


def _kernel(impl, name):
    """The learner's @triton.jit kernel ``name`` (``checks.jit_kernel``) and its parameters' names."""
    fn = checks.jit_kernel(impl, name, "ex05b", KERNELS[name])
    return fn, list(inspect.signature(getattr(fn, "fn", fn)).parameters)


# The harnesses: the learner's kernel (KERNEL) called as Triton code from a kernel of the grader's,
# so that its body is what runs in each program; then the program marks its slot of Ran.

@triton.jit
def _mark(Ran):
    tl.store(Ran + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), 1)


@triton.jit
def _add_harness(out_ptr, x_ptr, y_ptr, n, stride_x, stride_y, stride_out, Ran,
                 BLOCK: tl.constexpr, KERNEL: tl.constexpr):
    KERNEL(out_ptr, x_ptr, y_ptr, n, stride_x, stride_y, stride_out, BLOCK)
    _mark(Ran)


@triton.jit
def _copy_harness(out_ptr, x_ptr, M, N, stride_xm, stride_xn, stride_om, stride_on, Ran,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KERNEL: tl.constexpr):
    KERNEL(out_ptr, x_ptr, M, N, stride_xm, stride_xn, stride_om, stride_on, BLOCK_M, BLOCK_N)
    _mark(Ran)


@triton.jit
def _matmul_harness(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    stride_cm, stride_cn, Ran, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, KERNEL: tl.constexpr):
    KERNEL(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
           stride_cn, BLOCK_M, BLOCK_N, BLOCK_K)
    _mark(Ran)


@triton.jit
def _attention_harness(o_ptr, q_ptr, k_ptr, v_ptr, n_keys, d, scale, stride_qm, stride_qd,
                       stride_km, stride_kd, stride_vm, stride_vd, stride_om, stride_od, Ran,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, KERNEL: tl.constexpr):
    KERNEL(o_ptr, q_ptr, k_ptr, v_ptr, n_keys, d, scale, stride_qm, stride_qd, stride_km,
           stride_kd, stride_vm, stride_vd, stride_om, stride_od, BLOCK_N, BLOCK_D)
    _mark(Ran)


HARNESSES = {"add_kernel": _add_harness, "copy_tile_kernel": _copy_harness,
             "matmul_tile_kernel": _matmul_harness, "attention_row_kernel": _attention_harness}


def _launch(impl, name, grid, *args, **kwargs):
    """kernel[grid](*args, **kwargs) with the learner's kernel ``name``, run by its harness; while
    _READS is a list, the loads it makes outside the tensors among args are recorded there. Fails
    if the kernel changed an input (every tensor argument but the first, the output) in place, or
    if a program of the grid did not run."""
    kernel, params = _kernel(impl, name)
    tensors = [(p.removesuffix("_ptr"), a) for p, a in zip(params, args)
               if isinstance(a, torch.Tensor)]
    inputs = dict(tensors[1:])                          # all but the first, the output
    ran = torch.zeros(math.prod(grid), dtype=torch.int32, device=DEV)
    with checks.loads_recorded() if _READS is not None else contextlib.nullcontext() as loads, \
            checks.inputs_kept(f"your {name}", **inputs):   # the references read the inputs
        try:
            HARNESSES[name][grid](*args, ran, **kwargs, KERNEL=kernel)
        except Exception as e:
            if "NotImplementedError" in f"{type(e).__name__}: {e}":
                raise NotImplementedError(f"ex05b: {name}'s body is not written yet") from e
            raise
        if DEV.type == "cuda":
            torch.cuda.synchronize()
    checks.expect_every_program_ran(ran, name, grid)
    if loads is not None:
        _READS.append((name, _stray_loads(loads, tensors)))


def _vector_add(impl, x, y, out, *, block=64):
    """The stub's vector_add: one add_kernel program per block of ``block`` elements."""
    n = x.shape[0]
    _launch(impl, "add_kernel", (triton.cdiv(n, block),), out, x, y, n, x.stride(0), y.stride(0),
            out.stride(0), BLOCK=block, num_warps=2)


def _copy_matrix(impl, x, out, *, block_m=16, block_n=32):
    """The stub's copy_matrix: a 2-D grid of copy_tile_kernel programs."""
    M, N = x.shape
    _launch(impl, "copy_tile_kernel", (triton.cdiv(M, block_m), triton.cdiv(N, block_n)), out, x,
            M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1), BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=4)


def _matmul_tiles(impl, a, b, out, *, block_m=32, block_n=32, block_k=32):
    """The stub's matmul: one matmul_tile_kernel program per (block_m, block_n) tile of C."""
    (M, K), N = a.shape, b.shape[1]
    _launch(impl, "matmul_tile_kernel", (triton.cdiv(M, block_m), triton.cdiv(N, block_n)), out,
            a, b, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
            out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4,
            num_stages=1 if runtime.INTERPRET else 2)


def _attention_rows(impl, q, k, v, out, *, scale, block_n=None, block_d=None):
    """The stub's attention_rows: one attention_row_kernel program per query row; blocks the
    next powers of two of n_keys and d unless given."""
    (M, d), n_keys = q.shape, k.shape[0]
    _launch(impl, "attention_row_kernel", (M,), out, q, k, v, n_keys, d, scale, q.stride(0),
            q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0),
            out.stride(1), BLOCK_N=block_n or triton.next_power_of_2(n_keys),
            BLOCK_D=block_d or triton.next_power_of_2(d), num_warps=4)


def _stray_loads(loads, tensors):
    """Phrases naming what the recorded loads read outside the views ``tensors`` ((name, view)
    pairs), e.g. "x: 31 elements outside it"; empty when every load stayed inside one."""
    read = np.unique(np.concatenate(loads)) if loads else np.zeros(0, dtype=np.uint64)
    stray = read[~np.isin(read, np.concatenate([checks.element_addresses(t) for _, t in tensors]))]
    starts = np.array([t.data_ptr() for _, t in tensors], dtype=np.uint64)
    # each stray address belongs to the view that starts last before it (the one it runs past)
    owner = np.array([int(np.argmax(np.where(starts <= a, starts, 0))) if (starts <= a).any()
                      else -1 for a in stray], dtype=np.int64)
    found = [f"{name}: {int((owner == i).sum())} elements outside it are loaded"
             for i, (name, _) in enumerate(tensors) if (owner == i).any()]
    if (owner < 0).any():
        found.append(f"{int((owner < 0).sum())} elements before every tensor are loaded")
    return found


# ---- strided views inside padded buffers ------------------------------------------------------

def _to(x, dtype):
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=DEV)


def _vector(values, *, stride, pad, dtype):
    """A 1-D view of stride ``stride`` holding ``values``, inside a buffer of ``pad``."""
    n = len(values)
    buf = torch.full((stride * (n + SPILL) + 3,), pad, dtype=dtype, device=DEV)
    view = buf[1::stride][:n]
    view.copy_(_to(values, dtype))
    return view, buf


def _matrix(values, *, layout, pad, dtype):
    """A 2-D view holding ``values`` (M, N), inside a buffer of ``pad``; layout:
    "contiguous" (strides (N, 1), the buffer's tail after it), "rows" (padded rows),
    "transposed" (a view of a transposed buffer: strides (1, rows)), "every_other" (every other
    column of padded rows)."""
    M, N = np.shape(values)
    if layout == "contiguous":
        buf = torch.full((M * N + SPILL * (N + SPILL) + SPILL,), pad, dtype=dtype, device=DEV)
        view = buf[:M * N].view(M, N)
    elif layout == "rows":
        buf = torch.full((M + SPILL, N + SPILL + 5), pad, dtype=dtype, device=DEV)
        view = buf[:M, :N]
    elif layout == "transposed":
        buf = torch.full((N + SPILL, M + SPILL + 3), pad, dtype=dtype, device=DEV)
        view = buf[:N, :M].T
    elif layout == "every_other":
        buf = torch.full((M + SPILL, 2 * (N + SPILL) + 1), pad, dtype=dtype, device=DEV)
        view = buf[:M, 0:2 * N:2]
    else:
        raise ValueError(f"layout={layout!r}")
    view.copy_(_to(values, dtype))
    return view, buf


def _written_outside(out, buf):
    """Positions of buf outside the view ``out`` that are no longer NaN."""
    owned = torch.zeros(buf.shape, dtype=torch.bool, device=buf.device)
    torch.as_strided(owned, out.shape, out.stride(), out.storage_offset() - buf.storage_offset()
                     ).fill_(True)
    return (~torch.isnan(buf) & ~owned).cpu().numpy()


def _np(t):
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    return t.detach().double().cpu().numpy()


def _ok(got, expected, rtol=1e-3, atol=1e-5):
    return bool(np.allclose(got, expected, rtol=rtol, atol=atol))


# ---- (a) strided vector add -------------------------------------------------------------------

def _add(impl, x, y, *, strides=(3, 2, 2), pad=40.0, dtype=torch.float32, **blocks):
    xv, _ = _vector(x, stride=strides[0], pad=pad, dtype=dtype)
    yv, _ = _vector(y, stride=strides[1], pad=pad, dtype=dtype)
    out, out_buf = _vector(np.zeros(len(x)), stride=strides[2], pad=float("nan"), dtype=dtype)
    out.fill_(float("nan"))
    _vector_add(impl, xv, yv, out, **blocks)
    return _np(out), _written_outside(out, out_buf).any(), xv, yv


def _diagnose_add(impl):
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(97), rng.standard_normal(97)
    got, outside, _, _ = _add(impl, x, y, strides=(3, 2, 2))
    if outside:
        return HINT_TAIL
    if not _ok(got, x + y) and _ok(_add(impl, x, y, strides=(1, 1, 1))[0], x + y):
        return HINT_STRIDE_1D
    return None


def check_vector_add(impl, rng):
    """(a) vector add: strided vectors of length 1, 17, 97, 130, writing nothing past the end"""
    for n, strides in ((1, (1, 1, 1)), (17, (3, 2, 1)), (97, (2, 5, 3)), (130, (1, 3, 2))):
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        got, outside, xv, yv = _add(impl, x, y, strides=strides)
        what = f"vector_add of length {n}, strides {strides}"
        if outside:
            checks.fail(f"{what}: wrote outside out", _diagnose_add(impl) or HINT_TAIL)
        expected = _np(xv) + _np(yv)
        checks.expect_close(got, expected, baseline=_np(xv + yv), dtype=torch.float32,
                            name=what, hint=lambda: _diagnose_add(impl))


# ---- (b) 2-D masked tile of a strided matrix ---------------------------------------------------

def _copy(impl, x, *, layout, out_layout="rows", pad=40.0, dtype=torch.float32, **blocks):
    xv, _ = _matrix(x, layout=layout, pad=pad, dtype=dtype)
    out, out_buf = _matrix(np.zeros(np.shape(x)), layout=out_layout, pad=float("nan"), dtype=dtype)
    out.fill_(float("nan"))
    _copy_matrix(impl, xv, out, **blocks)
    return _np(out), _written_outside(out, out_buf).any()


def _diagnose_copy(impl):
    x = np.random.default_rng(6).standard_normal((17, 45))
    got, outside = _copy(impl, x, layout="contiguous", out_layout="contiguous")
    if outside:
        return HINT_2D_MASK
    if _ok(got, x):
        return HINT_STRIDE_2D
    return None


def check_copy_tile(impl, rng):
    """(b) 2-D tiles: copies of (1, 1), (17, 45), (40, 97), (33, 20) views, transposed and strided"""
    for (M, N), layout, out_layout in (((1, 1), "rows", "rows"), ((17, 45), "transposed", "rows"),
                                       ((40, 97), "every_other", "transposed"),
                                       ((33, 20), "rows", "every_other")):
        x = rng.standard_normal((M, N))
        got, outside = _copy(impl, x, layout=layout, out_layout=out_layout)
        what = f"copy_matrix of a ({M}, {N}) {layout} view into a {out_layout} one"
        if outside:
            checks.fail(f"{what}: wrote outside the output matrix",
                        _diagnose_copy(impl) or HINT_2D_MASK)
        expected = _np(_to(x, torch.float32))
        checks.expect_close(got, expected, baseline=expected, dtype=torch.float32, name=what,
                            hint=lambda: _diagnose_copy(impl))


# ---- (c) one matmul tile ----------------------------------------------------------------------

def _matmul(impl, a, b, *, layouts=("rows", "transposed", "rows"), pad=40.0, dtype=torch.float32,
            **blocks):
    """C = A @ B, inputs in ``dtype`` and the output in float32. Returns (C, written outside,
    the inputs as the kernel saw them in float64)."""
    av, _ = _matrix(a, layout=layouts[0], pad=pad, dtype=dtype)
    bv, _ = _matrix(b, layout=layouts[1], pad=pad, dtype=dtype)
    out, out_buf = _matrix(np.zeros((a.shape[0], b.shape[1])), layout=layouts[2],
                           pad=float("nan"), dtype=torch.float32)
    out.fill_(float("nan"))
    _matmul_tiles(impl, av, bv, out, **blocks)
    return _np(out), _written_outside(out, out_buf).any(), _np(av), _np(bv)


def _diagnose_matmul(impl):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((17, 70)), rng.standard_normal((70, 33))
    got_hi, outside, a64, b64 = _matmul(impl, a, b, pad=40.0)
    got_lo = _matmul(impl, a, b, pad=3.0)[0]       # not -40: pad * pad would be the same
    if outside:
        return HINT_2D_MASK
    if not np.array_equal(got_hi, got_lo, equal_nan=True):
        return HINT_K_TAIL
    if not _ok(got_hi, a64 @ b64, rtol=1e-5, atol=1e-5):
        plain = _matmul(impl, a, b, layouts=("contiguous", "contiguous", "contiguous"))
        if _ok(plain[0], plain[2] @ plain[3], rtol=1e-5, atol=1e-5):
            return HINT_STRIDE_2D
        return None
    big_a, big_b = rng.uniform(1, 4, (16, 256)), rng.uniform(1, 4, (256, 16))
    got, _, a16, b16 = _matmul(impl, big_a, big_b, dtype=torch.float16)
    if not _ok(got, a16 @ b16, rtol=1e-5, atol=1e-5):
        return HINT_FP16_ACC
    return None


def _block_k_hint(impl, a, b, layouts, dtype):
    """HINT_BLOCK_K when the same product is right with the default block_k, else None."""
    got, _, a64, b64 = _matmul(impl, a, b, layouts=layouts, dtype=dtype)
    return HINT_BLOCK_K if _ok(got, a64 @ b64, rtol=1e-5, atol=1e-5) else None


def check_matmul_tile(impl, rng):
    """(c) matmul tiles: K = 1, 70, 130, 200, transposed inputs, float16 inputs summed in float32,
    block_k = 16 and 64"""
    cases = (((1, 1, 1), torch.float32, ("rows", "rows", "rows"), 32),
             ((17, 33, 70), torch.float32, ("transposed", "every_other", "rows"), 32),
             ((45, 37, 130), torch.float32, ("rows", "transposed", "transposed"), 32),
             ((40, 20, 200), torch.float16, ("rows", "transposed", "rows"), 32),
             ((20, 24, 100), torch.float32, ("rows", "transposed", "rows"), 16),
             ((20, 24, 150), torch.float32, ("transposed", "rows", "rows"), 64))
    for (M, N, K), dtype, layouts, block_k in cases:
        a = rng.standard_normal((M, K)) + (1.5 if dtype == torch.float16 else 0.0)
        b = rng.standard_normal((K, N)) + (1.5 if dtype == torch.float16 else 0.0)
        blocks = {} if block_k == 32 else {"block_k": block_k}
        got, outside, a64, b64 = _matmul(impl, a, b, layouts=layouts, dtype=dtype, **blocks)
        what = (f"matmul ({M}, {K}) @ ({K}, {N}), {dtype} inputs, layouts {layouts}, "
                f"block_k={block_k}")
        if outside:
            checks.fail(f"{what}: wrote outside C", _diagnose_matmul(impl) or HINT_2D_MASK)
        baseline = (torch.from_numpy(a64).float() @ torch.from_numpy(b64).float()).double().numpy()
        checks.expect_close(got, a64 @ b64, baseline=baseline, dtype=torch.float32, name=what,
                            magnitude=float((np.abs(a64) @ np.abs(b64)).max()),
                            hint=lambda: _diagnose_matmul(impl) or (
                                 _block_k_hint(impl, a, b, layouts, dtype) if blocks else None))


# ---- (d) one attention row --------------------------------------------------------------------

def _qkv(rng, M, n_keys, d, size):
    """Q (M, d), K and V (n_keys, d) whose scores q.k are mostly negative (about -d/2 size^2), so
    that a padded lane scoring 0 instead of -inf would take most of the probability."""
    q = size * (rng.standard_normal((M, d)) - 0.5)
    k = size * (rng.standard_normal((n_keys, d)) + 1.0)
    return q, k, size * rng.standard_normal((n_keys, d))


def _far_qkv(rng, M, n_keys, d, score, scale):
    """Q (M, d), K and V (n_keys, d) whose scaled scores all lie near ``score`` (far below 0,
    under any finite stand-in a padded lane might be given): a few units apart within a row where
    float32 resolves that (|score| <= 1e5), else a thousandth of |score| apart (one key takes
    all the probability, whatever the rounding)."""
    a = np.sqrt(-score / (scale * d))
    q = -a * (1 + 0.01 * rng.standard_normal((M, d)))
    if -score <= 1e5:
        k = a + 3 * rng.standard_normal((n_keys, d)) / (scale * a * np.sqrt(d))
    else:
        k = a * (1 + 1e-3 * rng.permutation(n_keys))[:, None] * np.ones(d)
    return q, k, rng.standard_normal((n_keys, d))


def _attention64(q, k, v, scale):
    s = scale * q @ k.T                                                   # (M, n_keys)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v                         # (M, d)


def _attention(impl, q, k, v, *, scale, layouts=("rows", "transposed", "every_other", "rows"),
               pad=40.0, dtype=torch.float32, **blocks):
    qv, _ = _matrix(q, layout=layouts[0], pad=pad, dtype=dtype)
    kv, _ = _matrix(k, layout=layouts[1], pad=pad, dtype=dtype)
    vv, _ = _matrix(v, layout=layouts[2], pad=pad, dtype=dtype)
    out, out_buf = _matrix(np.zeros(q.shape), layout=layouts[3], pad=float("nan"), dtype=dtype)
    out.fill_(float("nan"))
    _attention_rows(impl, qv, kv, vv, out, scale=scale, **blocks)
    return _np(out), _written_outside(out, out_buf).any(), (_np(qv), _np(kv), _np(vv))


def _diagnose_attention(impl):
    rng = np.random.default_rng(8)
    plain = ("contiguous",) * 4

    def right(n_keys, d, *, scale=0.125, layouts=plain, size=1.0, far=None):
        q, k, v = _qkv(rng, 3, n_keys, d, size) if far is None else \
            _far_qkv(rng, 3, n_keys, d, far, scale)
        got, outside, (q64, k64, v64) = _attention(impl, q, k, v, scale=scale, layouts=layouts)
        return outside, np.all(np.isfinite(got)) and _ok(got, _attention64(q64, k64, v64, scale))

    outside, ok = right(17, 80, layouts=("rows", "transposed", "every_other", "rows"))
    if outside:
        return HINT_D_MASK
    if not ok:
        if right(16, 64)[1]:
            return HINT_STRIDE_2D if right(17, 80)[1] else HINT_PAD_SCORE
        return None
    if not right(16, 64, scale=1.0, size=4.0)[1] or not right(16, 64, scale=0.25, size=8.0)[1]:
        return HINT_MAX
    if not right(17, 80, far=-3e9)[1] and right(16, 64, far=-3e9)[1]:
        return HINT_PAD_SCORE
    return None


def check_attention_row(impl, rng):
    """(d) attention rows: 1, 17, 97, 130 keys, head dim 80 and 33, transposed K, large scores,
    scores far below 0"""
    cases = ((3, 1, 80, 0.125, 1.0, torch.float32), (5, 17, 80, 0.125, 1.0, torch.float32),
             (4, 97, 33, 1.0, 1.0, torch.float16), (3, 130, 80, 1.0, 4.0, torch.float32),
             (3, 50, 64, 0.25, 8.0, torch.float32),        # large scores, scale != 1
             (3, 37, 80, 0.5, -3e4, torch.float32),        # every score near -3e4 ...
             (3, 100, 48, 0.3, -3e9, torch.float32))       # ... or -3e9: padding must be -inf
    for M, n_keys, d, scale, size, dtype in cases:
        q, k, v = _qkv(rng, M, n_keys, d, size) if size > 0 else \
            _far_qkv(rng, M, n_keys, d, size, scale)
        got, outside, (q64, k64, v64) = _attention(impl, q, k, v, scale=scale, dtype=dtype)
        what = (f"attention of {M} queries over {n_keys} keys, d={d}, scale={scale}, {dtype} "
                f"(scores up to {np.abs(scale * q64 @ k64.T).max():.0f})")
        if outside:
            checks.fail(f"{what}: wrote outside O", _diagnose_attention(impl) or HINT_D_MASK)
        t = [torch.from_numpy(x).float() for x in (q64, k64, v64)]
        baseline = (torch.softmax(scale * t[0] @ t[1].T, -1) @ t[2]).to(dtype).double().numpy()
        mags = attention_magnitudes(q64[None, None], k64[None, None], v64[None, None], scale=scale)
        checks.expect_close(got, _attention64(q64, k64, v64, scale), baseline=baseline,
                            dtype=dtype, name=what, magnitude=mags["out"],
                            hint=lambda: _diagnose_attention(impl))


def _offset_qkv(rng, M, n_keys, d, score, scale):
    """Q (M, d), K and V (n_keys, d) whose scaled scores all lie near ``score`` (in the hundreds),
    a few units apart within a row: the softmax spreads over many keys, so a score rounded to
    float16 (by 1/8 near 300) moves p by percents."""
    a = np.sqrt(abs(score) / (scale * d))
    q = np.sign(score) * a * (1 + 0.01 * rng.standard_normal((M, d)))
    k = a + 2 * rng.standard_normal((n_keys, d)) / (scale * a * np.sqrt(d))
    return q, k, rng.standard_normal((n_keys, d))


def check_attention_float16(impl, rng):
    """(d) float16 attention rows with large scores (near +300 and -300, a few units apart):
    scores and softmax computed in float32"""
    for M, n_keys, d, scale, score in ((3, 50, 33, 1.0, 300.0), (4, 97, 48, 0.5, -300.0)):
        q, k, v = _offset_qkv(rng, M, n_keys, d, score, scale)
        got, outside, (q64, k64, v64) = _attention(impl, q, k, v, scale=scale, dtype=torch.float16)
        what = (f"float16 attention of {M} queries over {n_keys} keys, d={d}, scale={scale} "
                f"(scores near {score:.0f})")
        if outside:
            checks.fail(f"{what}: wrote outside O", _diagnose_attention(impl) or HINT_D_MASK)
        t = [torch.from_numpy(x).float() for x in (q64, k64, v64)]
        baseline = (torch.softmax(scale * t[0] @ t[1].T, -1) @ t[2]).half().double().numpy()
        mags = attention_magnitudes(q64[None, None], k64[None, None], v64[None, None], scale=scale)
        checks.expect_close(got, _attention64(q64, k64, v64, scale), baseline=baseline,
                            dtype=torch.float16, name=what, magnitude=mags["out"],
                            hint=lambda: _diagnose_attention(impl) or HINT_FP16)


def _right_by_default(run):
    """Whether ``run()`` (a case with the stub's block sizes) writes nothing outside its output
    and matches its float64 expectation to 1e-3."""
    got, expected, outside = run()
    return not outside and _ok(got, expected, rtol=1e-3, atol=1e-3)


def check_other_blocks(impl, rng):
    """the four kernels with other block sizes: the add with BLOCK = 16 and 128, the copy with
    64 x 16 tiles, the matmul with 16 x 64 x 32 tiles, attention rows with
    BLOCK_N and BLOCK_D twice n_keys and d rounded up (every block sticks out by less than the
    buffers' padding, SPILL)"""
    x, y = rng.standard_normal(97), rng.standard_normal(97)
    m = rng.standard_normal((40, 97))
    a1, b1 = rng.standard_normal((20, 70)), rng.standard_normal((70, 37))
    q, k, v = _qkv(rng, 3, 17, 20, 1.0)

    def add(**blocks):
        got, outside, xv, yv = _add(impl, x, y, strides=(2, 1, 3), **blocks)
        return got, _np(xv) + _np(yv), outside

    def copy(**blocks):
        got, outside = _copy(impl, m, layout="transposed", **blocks)
        return got, _np(_to(m, torch.float32)), outside

    def matmul(a, b):
        def run(**blocks):
            got, outside, a64, b64 = _matmul(impl, a, b, **blocks)
            return got, a64 @ b64, outside
        return run

    def attention(**blocks):
        got, outside, (q64, k64, v64) = _attention(impl, q, k, v, scale=0.5, **blocks)
        return got, _attention64(q64, k64, v64, 0.5), outside

    cases = ((add, {"block": 16}, "vector_add of 97 with BLOCK = 16"),
             (add, {"block": 128}, "vector_add of 97 with BLOCK = 128"),
             (copy, {"block_m": 64, "block_n": 16},
              "copy_matrix of a (40, 97) transposed view with BLOCK_M = 64, BLOCK_N = 16"),
             (matmul(a1, b1), {"block_m": 16, "block_n": 64, "block_k": 32},
              "matmul (20, 70) @ (70, 37) with BLOCK_M = 16, BLOCK_N = 64, BLOCK_K = 32"),
             (attention, {"block_n": 64, "block_d": 64},
              "attention of 3 queries over 17 keys, d=20, with BLOCK_N = 64, BLOCK_D = 64"))
    for run, blocks, what in cases:
        try:
            got, expected, outside = run(**blocks)
        except (checks.CheckFailed, NotImplementedError):
            raise
        except Exception as e:   # the learner's kernel failed with these blocks: was it right before?
            if _right_by_default(run):
                checks.fail(f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                            HINT_BLOCKS)
            raise
        if outside or not _ok(got, expected, rtol=1e-3, atol=1e-3):
            checks.fail(f"{what}: {'wrote outside the output' if outside else 'wrong result'} "
                        f"(max error {np.nanmax(np.abs(got - expected)):.3g})",
                        HINT_BLOCKS if _right_by_default(run) else None)


@checks.not_under_grade   # loads are seen only where the kernel runs: this process's interpreter
def check_reads_inside(impl, rng):
    """every load stays inside its tensor, even where its values are thrown away (the four
    kernels on ragged sizes, through the interpreter)"""
    global _READS
    _READS = []
    try:
        _add(impl, rng.standard_normal(37), rng.standard_normal(37), strides=(2, 1, 3))
        _copy(impl, rng.standard_normal((17, 45)), layout="rows")
        _matmul(impl, rng.standard_normal((17, 70)), rng.standard_normal((70, 33)))
        q, k, v = _qkv(rng, 3, 17, 33, 1.0)
        _attention(impl, q, k, v, scale=0.5)
    finally:
        reads, _READS = _READS, None
    for name, stray in reads:
        if stray:
            checks.fail(f"{name} reads outside its tensors: " + "; ".join(stray),
                        READS_WHY + HINT_READS[name])


CHECKS = [check_vector_add, check_copy_tile, check_matmul_tile, check_attention_row,
          check_attention_float16, check_other_blocks, check_reads_inside]


def _tensor_core_product(a64, b64):
    """A @ B of float16 values on the GPU's tensor cores, summed in float32: flashlib's tiled
    matmul kernel (lesson 05) writing float32. The GPU check's second baseline: tensor cores sum a
    tile's products in their own order and rounding (on an H100 about 50 float32 ulps at K = 700,
    against a few for a CPU's float32 loop), and a right answer does the same."""
    a, b = (torch.from_numpy(x).to(DEV, torch.float16) for x in (a64, b64))
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), dtype=torch.float32, device=DEV)
    library_matmul[(triton.cdiv(M, 64) * triton.cdiv(N, 64),)](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
        c.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, DOT_PRECISION="ieee")
    return c.double().cpu().numpy()


def check_gpu_real_size(impl, rng):
    """compiled for the GPU: the four puzzles at real sizes
    (an add of 100,003, a (1000, 777) transposed copy, a (500, 700) @ (700, 300) float16 matmul,
    2000 attention rows over 200 keys)"""
    x, y = rng.standard_normal(100_003), rng.standard_normal(100_003)
    got, outside, xv, yv = _add(impl, x, y, strides=(3, 2, 2))
    if outside:
        checks.fail("on the GPU, vector_add wrote outside out", HINT_TAIL)
    checks.expect_close(got, _np(xv) + _np(yv), baseline=_np(xv + yv), dtype=torch.float32,
                        name="vector_add of 100,003 on the GPU")
    x = rng.standard_normal((1000, 777))
    got, outside = _copy(impl, x, layout="transposed")
    if outside:
        checks.fail("on the GPU, copy_matrix wrote outside the output matrix", HINT_2D_MASK)
    expected = _np(_to(x, torch.float32))
    checks.expect_close(got, expected, baseline=expected, dtype=torch.float32,
                        name="copy_matrix of a (1000, 777) transposed view on the GPU")
    a, b = rng.standard_normal((500, 700)) + 1.5, rng.standard_normal((700, 300)) + 1.5
    got, outside, a64, b64 = _matmul(impl, a, b, dtype=torch.float16)
    if outside:
        checks.fail("on the GPU, matmul wrote outside C", HINT_2D_MASK)
    baseline = ((torch.from_numpy(a64).float() @ torch.from_numpy(b64).float()).double().numpy(),
                _tensor_core_product(a64, b64))
    checks.expect_close(got, a64 @ b64, baseline=baseline, dtype=torch.float32,
                        name="matmul (500, 700) @ (700, 300), float16 inputs, on the GPU",
                        magnitude=float((np.abs(a64) @ np.abs(b64)).max()))
    q, k, v = _qkv(rng, 2000, 200, 48, 1.0)
    got, outside, (q64, k64, v64) = _attention(impl, q, k, v, scale=0.125)
    if outside:
        checks.fail("on the GPU, attention_rows wrote outside O", HINT_D_MASK)
    t = [torch.from_numpy(x).float() for x in (q64, k64, v64)]
    baseline = (torch.softmax(0.125 * t[0] @ t[1].T, -1) @ t[2]).double().numpy()
    mags = attention_magnitudes(q64[None, None], k64[None, None], v64[None, None], scale=0.125)
    checks.expect_close(got, _attention64(q64, k64, v64, 0.125), baseline=baseline,
                        dtype=torch.float32, magnitude=mags["out"],
                        name="attention of 2000 queries over 200 keys, d=48, on the GPU")


# run only on a GPU (`flashlib check` compiles them after CHECKS pass through the interpreter)
GPU_CHECKS = [check_gpu_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex05b(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex05b_gpu(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
