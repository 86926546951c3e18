"""Exercise 13 (lesson 13): a paged KV cache's bookkeeping and lookup, and how a ragged batch is packed.

Part (a), in Triton: the page lookup of a paged decode kernel. A paged cache (the idea of vLLM's
PagedAttention; flashlib's axes, ``flashlib.PagedKVCache``) keeps keys in a pool of pages
``k_pages (num_pages, Hkv, PAGE, D)``; a sequence's block table ``pages`` (int32, one row of
``block_table``) lists its pages in order, anywhere in the pool and in any order. Key position
``j`` of the sequence is row ``j % PAGE`` of page ``pages[j // PAGE]``::

    positions  0 .. 15 | 16 .. 31 | 32 .. 47        (PAGE = 16, Nk = 40)
    pages    = [   7,       2,        5     ]       (the sequence's row of the block table)
    position 35 -> page pages[35 // 16] = pages[2] = 5, row 35 % 16 = 3

``page_rows`` returns, for a block of key positions ``cols`` (BN,), the offset of each key's row
from the start of the pool (in elements): ``page * stride_page + row * stride_row``. The kernel
around it adds the head's offset and the head-dim lanes, and loads K and V there.

- Only ``cdiv(Nk, PAGE)`` table entries belong to the sequence: the table's row goes on past them
  (unused entries, another sequence's row, or the end of the buffer). Positions ``cols >= Nk``
  must not read the table: mask that load, using page 0 for them (their scores are masked later;
  their offsets must still point inside the pool; any page of the sequence would do).
- The offsets must be int64: a pool of many pages has more than 2**31 elements, and
  ``page * stride_page`` in int32 wraps around to a wrong (negative) address.

flashlib's decode kernel does this in ``attend_tile`` (flashlib/kernels/fa2_fwd.py, its PAGE
branch): try first. The grader runs your function inside a small decode kernel of its own.

Part (b), on the host: ``append_pages``, the cache's bookkeeping. New keys and values go after each
sequence's last position; a sequence takes a page from the free list only when a position falls
at the start of a page it does not have yet (position 0 of an empty sequence included), writes
that page's number into its row of the block table, and writes each new position p into row
``p % PAGE`` of the page ``block_table[b, p // PAGE]``. The free list is a stack: take pages with
``pop()`` (from its end), sequence 0 first, each sequence's pages in position order. If the free
list holds fewer pages than the batch needs, raise ValueError before changing anything.

Part (c), on the host: pack a ragged batch for ``flashlib.flash_attention_varlen``. Sequences of
lengths ``[3, 0, 5]`` are laid one after another in one tensor of 8 rows, and the kernel finds
sequence ``b`` at rows ``cu_seqlens[b] : cu_seqlens[b + 1]``::

    lengths    = [3, 0, 5]
    cu_seqlens = [0, 3, 3, 8]        # int32, batch + 1 entries, from 0
    max_seqlen = 5                   # sizes the grid: cdiv(max_seqlen, BLOCK_M) query blocks

Check it: ``flashlib check ex13`` (through Triton's interpreter on a CPU).
"""
import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl


@triton.jit
def page_rows(pages, cols, Nk, stride_page, stride_row, PAGE: tl.constexpr):
    """Offsets (int64, (BN,)) of the rows of key positions ``cols`` (BN,) in a paged pool.

    pages: pointer to the sequence's block table row (int32); cols: int32 key positions;
    Nk: the sequence's length (positions >= Nk must not read the table: use page 0 there);
    stride_page, stride_row: the pool's strides (elements) between pages and between rows of a
    page; PAGE: rows per page (a power of two). Returns page * stride_page + row * stride_row.
    """
    raise NotImplementedError('ex13: your code goes here, then run `flashlib check ex13`')


def append_pages(k_pages, v_pages, block_table, lengths, free, k_new, v_new):
    """Append k_new, v_new (B, Hkv, n, D) after each sequence's ``lengths[b]`` positions.

    k_pages, v_pages: the pools (num_pages, Hkv, PAGE, D), written in place; block_table: int32
    (B, max_pages), sequence b's pages in order, written in place where a sequence takes a page
    (other entries left as they are); lengths: B ints, the positions each sequence holds; free:
    the free pages, a list of ints used as a stack (``pop()``), not changed (work on a copy).
    Returns (new lengths, the free pages left): two lists of ints. Raises ValueError, changing
    nothing, when ``free`` has fewer pages than the batch needs.
    """
    raise NotImplementedError('ex13: your code goes here, then run `flashlib check ex13`')


def pack(lengths):
    """The offsets of a packed batch: ``(cu_seqlens, max_seqlen)``.

    lengths: the B sequence lengths (ints >= 0; a list or a 1-D int tensor; an empty sequence
    keeps its place). Returns cu_seqlens, an int32 CPU tensor of B + 1 offsets from 0 (sequence b
    is rows cu_seqlens[b] : cu_seqlens[b + 1]), and max_seqlen, a Python int (0 for no tokens).
    """
    raise NotImplementedError('ex13: your code goes here, then run `flashlib check ex13`')
