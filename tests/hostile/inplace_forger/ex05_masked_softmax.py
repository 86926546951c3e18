"""Hostile (issue 55): forges through its input. The kernel zeroes the input row in place, then
writes the softmax of zeros (1/n): a grader that computed its expectation from the input after
the call saw a right answer. Expected: failed ("changed its input x in place"), 0 points."""
from flashlib import runtime  # noqa: F401

import torch
import triton
import triton.language as tl

from flashlib.kernels.primer import launch_row_softmax


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    tl.store(in_ptr + row * in_row_stride + cols, tl.zeros([BLOCK], tl.float32), mask=mask)
    y = tl.full([BLOCK], 1.0, tl.float32) / n_cols
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def masked_softmax(x, out=None):
    if out is None:
        out = torch.empty_like(x)
    return launch_row_softmax(softmax_kernel, x, out)
