"""Hostile (issue 55): no kernel at all: the launcher computes the softmax with torch and the
kernel is still the stub. Expected: not done, 0 points (the grader launches the kernel)."""
from flashlib import runtime  # noqa: F401

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    raise NotImplementedError('ex05: your code goes here, then run `flashlib check ex05`')


def masked_softmax(x, out=None):
    if out is None:
        out = torch.empty_like(x)
    out.copy_(torch.softmax(x.float(), dim=-1).to(x.dtype))
    return out
