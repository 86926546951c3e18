"""Exercise 05 (lesson 05): the body of a fused row-softmax kernel in Triton, with masked loads.

One program per row: program ``row`` loads the whole row as one block of BLOCK lanes (BLOCK, a
power of two, is the next one >= n_cols), computes the safe softmax in registers and stores the
row back: HBM is read once and written once. When n_cols is not a power of two, the lanes
``cols >= n_cols`` lie past the row's end: load them with ``mask=cols < n_cols`` and
``other=float("-inf")``, so that they add nothing to the max (max(x, -inf) = x) and nothing to
the sum (exp(-inf) = 0); store with the same mask, so nothing past the row is written.
Rows need not be contiguous: row ``row`` starts at ``in_ptr + row * in_row_stride`` (and
``out_ptr + row * out_row_stride``), in elements.

Write the kernel's body below: load (masked, other=-inf, converted to float32), subtract the row
max, exp, divide by the sum, store (masked, converted back with ``.to(out_ptr.dtype.element_ty)``).
``masked_softmax(x)`` below launches it; ``flashlib.kernels.primer.softmax_kernel`` is the
library's answer. Then run ``flashlib check ex05``. Without a GPU your kernel runs through
Triton's interpreter, where a load past the end without a mask returns whatever lies in memory
instead of failing: the grader places rows inside larger buffers to catch that.
"""
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
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)                                           # (BLOCK,)
    raise NotImplementedError('ex05: your code goes here, then run `flashlib check ex05`')


def masked_softmax(x, out=None):
    """Launch ``softmax_kernel`` on a 2D tensor x (rows, n_cols): one program per row.

    out: where to write (a new tensor like x when None); x and out may have any row stride but
    contiguous rows. Returns out.
    """
    if out is None:
        out = torch.empty_like(x)
    assert x.stride(1) == 1 and out.stride(1) == 1 and out.shape == x.shape
    return launch_row_softmax(softmax_kernel, x, out)
