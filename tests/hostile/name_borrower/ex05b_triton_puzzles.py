"""Hostile (issue 55): puzzle (c) by flashlib's own tiled matmul (lesson 05's ``matmul_kernel``),
reached by a name built at run time, which no static check sees, and called from the learner's
kernel on the tile's column of C (one tile column, so its program id is the tile row); the other
puzzles are left empty (no points from them). Expected: 0 points, "error: ...
flashlib.kernels.primer.matmul_kernel is flashlib's own answer ..." (the answer is not in the
copy of flashlib it sees)."""
import pkgutil

from flashlib import runtime  # noqa: F401
import triton
import triton.language as tl

_mm = pkgutil.resolve_name("flashlib.kernels." + "primer:matmul_kernel")


@triton.jit
def add_kernel(out_ptr, x_ptr, y_ptr, n, stride_x, stride_y, stride_out, BLOCK: tl.constexpr):
    pass


@triton.jit
def copy_tile_kernel(out_ptr, x_ptr, M, N, stride_xm, stride_xn, stride_om, stride_on,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pass


@triton.jit
def matmul_tile_kernel(c_ptr, a_ptr, b_ptr, M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    col = tl.program_id(1) * BLOCK_N
    _mm(a_ptr, b_ptr + col * stride_bn, c_ptr + col * stride_cn, M, tl.minimum(N - col, BLOCK_N),
        K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        BLOCK_M, BLOCK_N, BLOCK_K, 1, "ieee")


@triton.jit
def attention_row_kernel(o_ptr, q_ptr, k_ptr, v_ptr, n_keys, d, scale,
                         stride_qm, stride_qd, stride_km, stride_kd, stride_vm, stride_vd,
                         stride_om, stride_od, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pass
