"""Correct variant of ex13: positions widened to int64 first, the page chosen with tl.where after
an in-bounds load; cu_seqlens by padding a cumulative sum."""
import flashlib  # noqa: F401
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def page_rows(pages, cols, Nk, stride_page, stride_row, PAGE: tl.constexpr):
    pos = cols.to(tl.int64)
    inside = pos < Nk
    index = tl.where(inside, pos // PAGE, 0)               # entry 0 always belongs to the row
    page = tl.where(inside, tl.load(pages + index), 0).to(tl.int64)
    return page * stride_page + (pos % PAGE) * stride_row


def pack(lengths):
    lengths = torch.tensor([int(n) for n in lengths], dtype=torch.int32)
    cu_seqlens = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return cu_seqlens, int(lengths.max().item()) if len(lengths) else 0
