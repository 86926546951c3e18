"""Mutant of ex13: append_pages writes position p at row (p - start) % PAGE, counted from the
append's start instead of the sequence's."""
import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

EXPECTED_HINT = 'row p % PAGE'


@triton.jit
def page_rows(pages, cols, Nk, stride_page, stride_row, PAGE: tl.constexpr):
    """Offsets (int64, (BN,)) of the rows of key positions ``cols`` (BN,) in a paged pool.

    pages: pointer to the sequence's block table row (int32); cols: int32 key positions;
    Nk: the sequence's length (positions >= Nk must not read the table: use page 0 there);
    stride_page, stride_row: the pool's strides (elements) between pages and between rows of a
    page; PAGE: rows per page (a power of two). Returns page * stride_page + row * stride_row.
    """
    page = tl.load(pages + cols // PAGE, mask=cols < Nk, other=0).to(tl.int64)  # (BN,)
    row = (cols % PAGE).to(tl.int64)                                              # (BN,)
    return page * stride_page + row * stride_row


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
            k_pages[page, :, (p - start) % PAGE] = k_new[b, :, p - start]
            v_pages[page, :, (p - start) % PAGE] = v_new[b, :, p - start]
    return [s + n for s in lengths], free


def pack(lengths):
    """The offsets of a packed batch: ``(cu_seqlens, max_seqlen)``.

    lengths: the B sequence lengths (ints >= 0; a list or a 1-D int tensor; an empty sequence
    keeps its place). Returns cu_seqlens, an int32 CPU tensor of B + 1 offsets from 0 (sequence b
    is rows cu_seqlens[b] : cu_seqlens[b + 1]), and max_seqlen, a Python int (0 for no tokens).
    """
    lengths = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)            # (B,)
    cu_seqlens = torch.zeros(lengths.numel() + 1, dtype=torch.int32)             # (B + 1,)
    cu_seqlens[1:] = torch.cumsum(lengths, 0)
    max_seqlen = int(lengths.max()) if lengths.numel() else 0
    return cu_seqlens, max_seqlen
