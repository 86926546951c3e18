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


def append_pages(k_pages, v_pages, block_table, lengths, free, k_new, v_new):
    """Append k_new, v_new (B, Hkv, n, D) after each sequence's ``lengths[b]`` positions.

    k_pages, v_pages: the pools (num_pages, Hkv, PAGE, D), written in place; block_table: int32
    (B, max_pages), sequence b's pages in order, written in place where a sequence takes a page
    (other entries left as they are); lengths: B ints, the positions each sequence holds; free:
    the free pages, a list of ints used as a stack (``pop()``), not changed (work on a copy).
    Returns (new lengths, the free pages left): two lists of ints. Raises ValueError, changing
    nothing, when ``free`` has fewer pages than the batch needs.
    """
    PAGE, n = k_pages.shape[2], k_new.shape[2]
    lengths, free = [int(x) for x in lengths], list(free)
    needed = sum(-(-(s + n) // PAGE) - -(-s // PAGE) for s in lengths)   # pages first touched
    if needed > len(free):
        raise ValueError(f"{needed} pages needed, {len(free)} free")
    for b, start in enumerate(lengths):
        for p in range(start, start + n):
            if p % PAGE == 0:                              # the first position of a new page
                block_table[b, p // PAGE] = free.pop()
            page = int(block_table[b, p // PAGE])
            k_pages[page, :, p % PAGE] = k_new[b, :, p - start]       # (Hkv, D)
            v_pages[page, :, p % PAGE] = v_new[b, :, p - start]
    return [s + n for s in lengths], free


def pack(lengths):
    lengths = torch.tensor([int(n) for n in lengths], dtype=torch.int32)
    cu_seqlens = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return cu_seqlens, int(lengths.max().item()) if len(lengths) else 0
