"""Mutant of ex05: a hard-coded block of 1024 lanes instead of BLOCK: rows longer than 1024 lose
their tail."""
import torch
import triton
import triton.language as tl

from flashlib.kernels.primer import launch_row_softmax

EXPECTED_HINT = "rows longer than 1024 lose their tail"


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, 1024)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)
    num = tl.exp(z)
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def masked_softmax(x, out=None):
    if out is None:
        out = torch.empty_like(x)
    return launch_row_softmax(softmax_kernel, x, out)
