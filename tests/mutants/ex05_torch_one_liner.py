"""Mutant of ex05: a torch one-liner behind the kernel. softmax_kernel's body is the stub's with
the raise removed (it computes nothing), and its ``run`` (what ``kernel[grid](...)`` calls) is
replaced by torch's softmax of the rows it is given: every result is right, no Triton program
runs. A grader that launches ``kernel[grid]`` itself passes it."""
EXPECTED_HINT = "does not run its body"

from flashlib import runtime  # noqa: F401  (first: Triton's interpreter when there is no GPU)

import torch
import triton
import triton.language as tl

from flashlib.kernels.primer import launch_row_softmax


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    """Softmax of row ``tl.program_id(0)``: out[row, :n_cols] = softmax(in[row, :n_cols]).

    in_ptr, out_ptr: pointers to the first element of row 0; in_row_stride, out_row_stride:
    elements between the starts of two rows; n_cols: the row length; BLOCK: a power of two
    >= n_cols. Compute in float32; write exactly the n_cols elements of this row, nothing else.
    """
    pass
    # END SOLUTION


def masked_softmax(x, out=None):
    """Launch ``softmax_kernel`` on a 2D tensor x (rows, n_cols): one program per row.

    out: where to write (a new tensor like x when None); x and out may have any row stride but
    contiguous rows. Returns out.
    """
    if out is None:
        out = torch.empty_like(x)
    assert x.stride(1) == 1 and out.stride(1) == 1 and out.shape == x.shape
    return launch_row_softmax(softmax_kernel, x, out)


def _torch_softmax_kernel(out, x, in_row_stride, out_row_stride, n_cols, *args, grid, warmup, **kwargs):
    """softmax_kernel's launch replaced: the rows' softmax from torch, whatever the grid."""
    if not warmup:
        out.copy_(torch.softmax(x.double(), dim=-1).to(out.dtype))


softmax_kernel.run = _torch_softmax_kernel
