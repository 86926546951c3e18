"""Grader of exercise 05b (lesson 05): four Triton puzzles, one check each.

The learner's launchers (``vector_add``, ``copy_matrix``, ``matmul``, ``attention_rows``, supplied
in the stub) run their kernels, through Triton's interpreter without a GPU. There a load past the
end without a mask does not fail, it returns whatever lies in memory; so every input is a view
into a larger buffer whose other elements hold a pad value (an unmasked load reads them, in
bounds), and every output is a view into a buffer of NaN, so a store past the end or at a wrong
stride shows. The views are not contiguous (every other element, padded rows, transposed views,
every other column), the lengths are not multiples of the blocks (1, 17, 97, 130; head dim 80 and
33), and results are compared with float64 under flashlib.testing's rule. When a check fails,
probes name the mistake: a missing tail mask, a stride ignored (contiguous assumed), float16
accumulation in the matmul, padded score lanes that are not -inf, no max subtraction.
"""
import numpy as np
import pytest
import torch
import triton

from flashlib.course import checks, grading
from flashlib import runtime
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex05b

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
HINT_D_MASK = ("your kernel writes past the head dim d (up to BLOCK_D) or outside the output "
               "rows: store o with mask=dims < d at o_ptr + i * stride_om + dims * stride_od")


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

def _add(impl, x, y, *, strides=(3, 2, 2), pad=40.0, dtype=torch.float32):
    xv, _ = _vector(x, stride=strides[0], pad=pad, dtype=dtype)
    yv, _ = _vector(y, stride=strides[1], pad=pad, dtype=dtype)
    out, out_buf = _vector(np.zeros(len(x)), stride=strides[2], pad=float("nan"), dtype=dtype)
    out.fill_(float("nan"))
    checks.function(impl, "vector_add")(xv, yv, out)
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

def _copy(impl, x, *, layout, out_layout="rows", pad=40.0, dtype=torch.float32):
    xv, _ = _matrix(x, layout=layout, pad=pad, dtype=dtype)
    out, out_buf = _matrix(np.zeros(np.shape(x)), layout=out_layout, pad=float("nan"), dtype=dtype)
    out.fill_(float("nan"))
    checks.function(impl, "copy_matrix")(xv, out)
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
    checks.function(impl, "matmul")(av, bv, out, **blocks)
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
               pad=40.0, dtype=torch.float32):
    qv, _ = _matrix(q, layout=layouts[0], pad=pad, dtype=dtype)
    kv, _ = _matrix(k, layout=layouts[1], pad=pad, dtype=dtype)
    vv, _ = _matrix(v, layout=layouts[2], pad=pad, dtype=dtype)
    out, out_buf = _matrix(np.zeros(q.shape), layout=layouts[3], pad=float("nan"), dtype=dtype)
    out.fill_(float("nan"))
    checks.function(impl, "attention_rows")(qv, kv, vv, out, scale=scale)
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


CHECKS = [check_vector_add, check_copy_tile, check_matmul_tile, check_attention_row]


def _tensor_core_product(a64, b64):
    """A @ B of float16 values on the GPU's tensor cores, summed in float32: flashlib's tiled
    matmul kernel (lesson 05) writing float32. The GPU check's second baseline: tensor cores sum a
    tile's products in their own order and rounding (on an H100 about 50 float32 ulps at K = 700,
    against a few for a CPU's float32 loop), and a right answer does the same."""
    from flashlib.kernels.primer import matmul_kernel

    a, b = (torch.from_numpy(x).to(DEV, torch.float16) for x in (a64, b64))
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), dtype=torch.float32, device=DEV)
    matmul_kernel[(triton.cdiv(M, 64) * triton.cdiv(N, 64),)](
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
