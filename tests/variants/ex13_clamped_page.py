"""Correct variant of ex13: the table index clamped to the sequence's last page (no masked load),
the row as cols - page_index * PAGE; cu_seqlens built with a Python running sum."""
import flashlib  # noqa: F401
import torch
import triton
import triton.language as tl


@triton.jit
def page_rows(pages, cols, Nk, stride_page, stride_row, PAGE: tl.constexpr):
    last = tl.maximum(Nk - 1, 0) // PAGE                   # the sequence's last table entry
    index = tl.minimum(cols // PAGE, last)                 # (BN,) never past the sequence's pages
    page = tl.load(pages + index).to(tl.int64)
    row = (cols - (cols // PAGE) * PAGE).to(tl.int64)
    return page * stride_page + row * stride_row


def pack(lengths):
    offsets, total = [0], 0
    for n in lengths:
        total += int(n)
        offsets.append(total)
    return torch.tensor(offsets, dtype=torch.int32), max((int(n) for n in lengths), default=0)
