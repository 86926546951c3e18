"""Exercise 05b (lesson 05): four Triton kernels, a ladder from a vector add to a row of attention.

Each puzzle is a whole ``@triton.jit`` kernel whose body you write; its docstring is the spec and
the launcher under it (supplied) shows the grid, the block sizes and ``num_warps``/``num_stages``.
Every kernel takes *strides*, in elements, instead of assuming a contiguous layout: element
``(i, j)`` of a matrix ``x`` lives at ``x_ptr + i * stride_xm + j * stride_xn``, so a transposed
view (``x.T``) or every other column (``x[:, ::2]``) works with no copy. Block sizes are
``tl.constexpr``: known when the kernel is compiled, powers of two, so that ``tl.arange(0, BLOCK)``
has a fixed shape. Lengths are anything: the lanes past the end are **masked** on every load and
store.

(a) ``add_kernel``: out = x + y for strided vectors; one program per BLOCK elements.
(b) ``copy_tile_kernel``: one (BLOCK_M, BLOCK_N) tile of a strided matrix, loaded and stored with a
    2-D mask; a 2-D grid of programs covers the matrix.
(c) ``matmul_tile_kernel``: one (BLOCK_M, BLOCK_N) tile of C = A @ B, looping over K in BLOCK_K
    steps, accumulated in float32.
(d) ``attention_row_kernel``: one query's row of attention: scores s = scale * K q, p = softmax(s)
    (safe: subtract the max), o = sum_j p_j v_j; all n_keys keys in one block.

Then run ``flashlib check ex05b``. The grader launches your four kernels itself, as the
launchers below do and with other block sizes too (the launchers are yours to use, not graded).
Without a GPU the kernels run through Triton's interpreter, where a load past the end without a
mask returns whatever lies in memory instead of failing: the grader places every input inside a
larger buffer to catch that, and records the addresses every load reads. Limits: (d) holds the whole row
of keys in one block (the online softmax of lessons 02-07 lifts that); float16 and float32 inputs.
"""
from flashlib import runtime  # noqa: F401  (first: Triton's interpreter when there is no GPU)

import torch
import triton
import triton.language as tl


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``; a body not written yet (the stub's NotImplementedError,
    which Triton wraps in its own error) is raised as NotImplementedError."""
    try:
        kernel[grid](*args, **kwargs)
    except Exception as e:
        if "NotImplementedError" in f"{type(e).__name__}: {e}":
            raise NotImplementedError(f"{kernel.__name__}'s body is not written yet") from e
        raise

# ---- (a) strided vector add ------------------------------------------------------------------

@triton.jit
def add_kernel(out_ptr, x_ptr, y_ptr, n, stride_x, stride_y, stride_out, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i] for the BLOCK indices i of program ``tl.program_id(0)`` that are < n.

    Element i of x is at ``x_ptr + i * stride_x`` (likewise y, out); strides may be any positive
    number of elements. Program p owns indices p * BLOCK ... p * BLOCK + BLOCK - 1; the last
    program's block sticks out past n: mask its loads and its store.
    """
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)                     # (BLOCK,) indices of this program
    # BEGIN SOLUTION
    mask = offs < n                                              # the tail lanes are off
    x = tl.load(x_ptr + offs * stride_x, mask=mask)
    y = tl.load(y_ptr + offs * stride_y, mask=mask)
    tl.store(out_ptr + offs * stride_out, x + y, mask=mask)
    # END SOLUTION


def vector_add(x, y, out=None, *, block=64):
    """out = x + y with ``add_kernel``; x, y, out: 1-D tensors of one length, any strides."""
    if out is None:
        out = torch.empty_like(x)
    n = x.shape[0]
    grid = (triton.cdiv(n, block),)                              # one program per block
    launch(add_kernel, grid, out, x, y, n, x.stride(0), y.stride(0), out.stride(0), BLOCK=block,
           num_warps=2)                                          # 64 lanes: 2 warps of 32 threads
    return out


# ---- (b) a 2-D tile of a strided matrix ------------------------------------------------------

@triton.jit
def copy_tile_kernel(out_ptr, x_ptr, M, N, stride_xm, stride_xn, stride_om, stride_on,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[m, n] = x[m, n] on the tile of program (tl.program_id(0), tl.program_id(1)).

    Program (pid_m, pid_n) owns rows pid_m * BLOCK_M + [0, BLOCK_M) and columns
    pid_n * BLOCK_N + [0, BLOCK_N). Element (m, n) of x is at ``x_ptr + m * stride_xm +
    n * stride_xn``, of out at ``out_ptr + m * stride_om + n * stride_on``:
    build a (BLOCK_M, BLOCK_N) block of pointers from the row and column offsets
    (``rows[:, None]``, ``cols[None, :]``), load it with a 2-D mask (row < M and column < N) and
    store it with the same mask. x may be a transposed or sliced view: never assume stride 1.
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # (BLOCK_M,)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)   # (BLOCK_N,)
    # BEGIN SOLUTION
    mask = (rows[:, None] < M) & (cols[None, :] < N)             # (BLOCK_M, BLOCK_N)
    tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, tile, mask=mask)
    # END SOLUTION


def copy_matrix(x, out=None, *, block_m=16, block_n=32):
    """out = x (any 2-D strides, e.g. x.T) with a 2-D grid of ``copy_tile_kernel`` programs."""
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    M, N = x.shape
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))   # a 2-D grid: tile rows x tile cols
    launch(copy_tile_kernel, grid, out, x, M, N, x.stride(0), x.stride(1), out.stride(0),
           out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4)
    return out


# ---- (c) one tile of a matmul ----------------------------------------------------------------

@triton.jit
def matmul_tile_kernel(c_ptr, a_ptr, b_ptr, M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[tile] = A[tile rows, :] @ B[:, tile cols] for the tile of program (pid_m, pid_n).

    A is (M, K), B is (K, N), C is (M, N), each with its own strides. Keep a float32 accumulator
    ``acc`` of shape (BLOCK_M, BLOCK_N); for k0 = 0, BLOCK_K, 2 BLOCK_K, ... < K load the
    (BLOCK_M, BLOCK_K) tile of A and the (BLOCK_K, BLOCK_N) tile of B (masked, ``other=0.0``:
    a zero adds nothing to a dot product) and ``acc = tl.dot(a, b, acc)``. Store
    ``acc.to(c_ptr.dtype.element_ty)`` with a mask. Accumulate in float32 even for float16 inputs.
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # (BLOCK_M,)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)   # (BLOCK_N,)
    ks = tl.arange(0, BLOCK_K)                                   # (BLOCK_K,)
    # BEGIN SOLUTION
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a = tl.load(a_ptr + rows[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)     # (BM, BK)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (cols[None, :] < N), other=0.0)     # (BK, BN)
        acc = tl.dot(a, b, acc, input_precision="ieee")                         # (BM, BN) float32
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))
    # END SOLUTION


def matmul(a, b, out=None, *, block_m=32, block_n=32, block_k=32):
    """C = A @ B with ``matmul_tile_kernel``: a (M, K), b (K, N), any strides, one dtype."""
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    launch(matmul_tile_kernel, grid, out, a, b, M, N, K, a.stride(0), a.stride(1), b.stride(0),
           b.stride(1), out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
           BLOCK_K=block_k, num_warps=4, num_stages=2)   # 2 stages: load tile k+1 during dot k
    return out


# ---- (d) one row of attention ----------------------------------------------------------------

@triton.jit
def attention_row_kernel(o_ptr, q_ptr, k_ptr, v_ptr, n_keys, d, scale,
                         stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
                         stride_om, stride_od, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """o[i] = softmax(scale * K q_i) @ V for the query i = tl.program_id(0), in float32.

    q_i is row i of Q (d entries, at ``q_ptr + i * stride_qm + c * stride_qd``); K and V are
    (n_keys, d), O is like Q. BLOCK_N >= n_keys and BLOCK_D >= d are powers of two: load q_i as
    (BLOCK_D,), K and V as (BLOCK_N, BLOCK_D) blocks, masked on both axes (other=0.0). Then
    s = scale * sum over c of K[j, c] q_i[c], a (BLOCK_N,) vector; the lanes j >= n_keys are no
    keys at all: set their score to -inf (``tl.where``) so that they get probability 0;
    subtract the max, exp, divide by the sum; o_i = sum_j p_j V[j, :]; store its d entries.
    """
    i = tl.program_id(0)
    keys = tl.arange(0, BLOCK_N)                                 # (BLOCK_N,)
    dims = tl.arange(0, BLOCK_D)                                 # (BLOCK_D,)
    # BEGIN SOLUTION
    key_ok, dim_ok = keys < n_keys, dims < d
    q = tl.load(q_ptr + i * stride_qm + dims * stride_qd, mask=dim_ok, other=0.0).to(tl.float32)
    kv_mask = key_ok[:, None] & dim_ok[None, :]                  # (BLOCK_N, BLOCK_D)
    k = tl.load(k_ptr + keys[:, None] * stride_kn + dims[None, :] * stride_kd, mask=kv_mask,
                other=0.0).to(tl.float32)
    v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * stride_vd, mask=kv_mask,
                other=0.0).to(tl.float32)
    s = tl.sum(k * q[None, :], axis=1) * scale                   # (BLOCK_N,) scores
    s = tl.where(key_ok, s, float("-inf"))                       # padded lanes: no key, p = 0
    p = tl.exp(s - tl.max(s, axis=0))
    p = p / tl.sum(p, axis=0)
    o = tl.sum(p[:, None] * v, axis=0)                           # (BLOCK_D,)
    tl.store(o_ptr + i * stride_om + dims * stride_od, o.to(o_ptr.dtype.element_ty), mask=dim_ok)
    # END SOLUTION


def attention_rows(q, k, v, out=None, *, scale=None):
    """O = softmax(scale Q K^T) V, one ``attention_row_kernel`` program per query row.

    q: (M, d), k and v: (n_keys, d), any strides, one dtype; scale: 1/sqrt(d) when None.
    """
    M, d = q.shape
    n_keys = k.shape[0]
    scale = d ** -0.5 if scale is None else scale
    if out is None:
        out = torch.empty((M, d), dtype=q.dtype, device=q.device)
    launch(attention_row_kernel, (M,), out, q, k, v, n_keys, d, scale, q.stride(0), q.stride(1),
           k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
           BLOCK_N=triton.next_power_of_2(n_keys), BLOCK_D=triton.next_power_of_2(d), num_warps=4)
    return out
