"""Hostile (issue 55): a torch one-liner behind the four kernels (tests/mutants/ex05b_torch_one_liner.py):
the bodies compute nothing and each kernel's ``run``, what ``kernel[grid](...)`` calls, is
torch on the tensors. Expected: 0 points (the grader runs each kernel's body from a harness
kernel of its own; in-process grading also names the replaced run)."""
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
    pass


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
    pass


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
    pass


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
    pass


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


# ---- the launches replaced ---------------------------------------------------------------------

def _torch(compute):
    """A kernel's run: torch on the launch's tensors, whatever the grid."""
    def run(*args, grid, warmup, **kwargs):
        if not warmup:
            compute(*args)
    return run


add_kernel.run = _torch(lambda out, x, y, *_: out.copy_(x + y))
copy_tile_kernel.run = _torch(lambda out, x, *_: out.copy_(x))
matmul_tile_kernel.run = _torch(lambda c, a, b, *_: c.copy_(a.float() @ b.float()))
attention_row_kernel.run = _torch(lambda o, q, k, v, n_keys, d, scale, *_: o.copy_(
    torch.softmax(scale * q.float() @ k.float().T, -1) @ v.float()))
