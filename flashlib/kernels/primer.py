"""Triton primer (lesson 05): a fused row softmax and a tiled matmul, the two patterns FlashAttention
is made of.

A Triton kernel is one function run by many *programs* (a grid of them, ``tl.program_id``); each
program works on a *block*, a power-of-two vector or tile of elements it loads from HBM with
pointer arithmetic, computes on in registers/SRAM, and stores back. Lengths that are not a multiple
of the block are handled by *masked* loads and stores: lanes past the end are not read (they take
the ``other`` value) and not written.

- ``softmax(x)``: one program per row, the whole row in one block (BLOCK = next power of two
  >= n_cols). The padded lanes load ``-inf`` so they add nothing to the max (max(x, -inf) = x) and
  nothing to the sum (exp(-inf) = 0). Cost, for an (M, N) input: read MN, write MN, one pass over
  HBM each way, against torch's unfused ``exp(x - max) / sum`` which reads and writes the
  intermediate several times (the Triton tutorial "Fused Softmax" measures the same idea).
  Limit: a row must fit in one block (n_cols <= MAX_COLS); longer rows need the online softmax of
  lesson 02, which is what FlashAttention does with its rows of scores.
- ``matmul(a, b)``: (M, K) @ (K, N), one program per BLOCK_M x BLOCK_N tile of the output,
  looping over K in BLOCK_K steps and accumulating in float32; masks handle any M, N, K. Cost:
  2MNK flops; reads (MK * N/BLOCK_N + KN * M/BLOCK_M), writes MN: bigger tiles read less, which
  is the whole argument of FlashAttention's tiling (FA1 paper, section 3.2). Programs are ordered
  in groups of GROUP_M tile rows so neighbours share tiles of B in the L2 cache.

Works with Triton 3.6 on a GPU and 3.9's interpreter on CPU (pointer arithmetic, no block
pointers). float32, float16 and bfloat16; bfloat16 runs in float32 through the interpreter, which
computes bfloat16 wrongly. float32 matmuls use exact ``ieee`` dots unless ``allow_tf32``.
Fixed block configs (no autotuning): a primer, not the fastest matmul.
"""
import torch
import triton
import triton.language as tl

from .. import runtime
from . import launch

__all__ = ["softmax", "launch_row_softmax", "matmul", "softmax_kernel", "matmul_kernel", "MAX_COLS"]

MAX_COLS = 1 << 17   # one row in one block; beyond this registers spill badly (and Triton caps block sizes)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)




# ---------------------------------------------------------------------------------------------
# fused row softmax

@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)              # one program per row; int64: big tensors
    cols = tl.arange(0, BLOCK)                       # (BLOCK,) BLOCK >= n_cols, a power of two
    mask = cols < n_cols                             # the tail lanes past the row's end
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=float("-inf"))
    x = x.to(tl.float32)                             # compute in float32 whatever the input
    z = x - tl.max(x, axis=0)                        # safe softmax: exp never overflows
    num = tl.exp(z)                                  # exp(-inf) = 0 on the tail lanes
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check_2d(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2D (rows, cols), got shape {tuple(t.shape)}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of float32, float16, bfloat16")
    runtime.check_device(name, t)


def _softmax_warps(block):
    """More warps for longer rows, so each thread holds at most a few dozen elements."""
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def launch_row_softmax(kernel, x, out):
    """Run a row-softmax ``kernel`` (``softmax_kernel``'s signature) on x (M, N) into out (M, N).

    One program per row; rows contiguous, any row strides. Shared by ``softmax`` and exercise
    05's launcher. On a GPU an unsolved stub's ``raise`` is a compile error: it is turned back
    into the NotImplementedError it stands for.
    """
    runtime.check_kernel(kernel)
    block = triton.next_power_of_2(x.shape[1])
    try:
        # kernel[(rows,)](...), through flashlib's one launch point (kernels/launch.py)
        launch.run(kernel, (x.shape[0],), out, x, x.stride(0), out.stride(0), x.shape[1], BLOCK=block,
                   num_warps=_softmax_warps(block))
    except Exception as e:
        if "NotImplementedError" in f"{type(e).__name__}: {e}":
            raise NotImplementedError("the kernel's body is not written yet") from e
        raise
    return out


def softmax(x):
    """Softmax over the last axis of a 2D tensor, one fused pass: read MN, write MN.

    x: (M, N) float32/float16/bfloat16, any row stride (the last dim is made contiguous), any N
    from 1 to MAX_COLS. Returns a new (M, N) tensor of x's dtype; computed in float32.
    """
    _check_2d("x", x)
    M, N = x.shape
    if N > MAX_COLS:
        raise ValueError(f"x has {N} columns, over MAX_COLS={MAX_COLS}: one row must fit in one "
                         "block; for longer rows use the online softmax (lesson 02)")
    out_dtype = x.dtype
    x = x if x.stride(-1) == 1 else x.contiguous()
    if runtime.INTERPRET and x.dtype == torch.bfloat16:
        x = x.float()  # the interpreter's bfloat16 arithmetic is wrong
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out.to(out_dtype)
    launch_row_softmax(softmax_kernel, x, out)
    return out.to(out_dtype)


# ---------------------------------------------------------------------------------------------
# tiled matmul

@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # program id -> output tile (pid_m, pid_n), GROUP_M tile rows at a time: programs that run
    # together reuse the same few columns of B from L2 instead of each fetching its own
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                  # (BM,)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                  # (BN,)
    offs_k = tl.arange(0, BLOCK_K)                                    # (BK,)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak   # (BM, BK)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn   # (BK, BN)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # masked lanes load 0, which adds nothing to the dot product
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)        # (BM, BN) float32
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _matmul_config(dtype):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). Through the interpreter, 64-wide tiles
    (its cost is per program per loop step); on a GPU tiles whose pipeline fits a T4's 64 KB of
    shared memory: 2 bytes x (128x32 + 32x128) x 3 stages = 48 KB (float32: 64x64 tiles)."""
    if runtime.INTERPRET:
        return 64, 64, 64, 4, 1
    if dtype == torch.float32:
        return 64, 64, 32, 4, 3
    return 128, 128, 32, 4, 3


def matmul(a, b, *, allow_tf32=False):
    """C = A @ B with a tiled Triton kernel.

    a: (M, K), b: (K, N), same dtype (float32/float16/bfloat16), any strides, any M, N, K >= 1.
    Returns (M, N) in that dtype, accumulated in float32. allow_tf32: float32 inputs on TF32
    tensor cores (about 1e-3 relative error) instead of exact ieee dots.
    """
    _check_2d("a", a)
    _check_2d("b", b)
    runtime.check_kernel(matmul_kernel)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns "
                         f"({a.shape[1]}) must equal b's rows ({b.shape[0]})")
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} and b is {b.dtype}: give both the same dtype")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} and b on {b.device}: put both on one device")
    M, K = a.shape
    N = b.shape[1]
    out_dtype = a.dtype
    if runtime.INTERPRET and a.dtype == torch.bfloat16:
        a, b = a.float(), b.float()  # bfloat16 dots are wrong in the interpreter
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c.to(out_dtype)
    if K == 0:
        return c.zero_().to(out_dtype)
    bm, bn, bk, warps, stages = _matmul_config(a.dtype)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    precision = "tf32" if allow_tf32 and a.dtype == torch.float32 else "ieee"
    launch.run(matmul_kernel, grid, a, b, c, M, N, K,   # matmul_kernel[grid](...)
               a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
               BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, DOT_PRECISION=precision,
               num_warps=warps, num_stages=stages)
    return c.to(out_dtype)
