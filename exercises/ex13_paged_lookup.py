"""Exercise 13 (lesson 13): where a key lives in a paged KV cache, and how a ragged batch is packed.

Part (a), in Triton: the page lookup of a paged decode kernel. A paged cache (vLLM's
PagedAttention layout, ``flashlib.PagedKVCache``) keeps keys in a pool of pages
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

Part (b), on the host: pack a ragged batch for ``flashlib.flash_attention_varlen``. Sequences of
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


def pack(lengths):
    """The offsets of a packed batch: ``(cu_seqlens, max_seqlen)``.

    lengths: the B sequence lengths (ints >= 0; a list or a 1-D int tensor; an empty sequence
    keeps its place). Returns cu_seqlens, an int32 CPU tensor of B + 1 offsets from 0 (sequence b
    is rows cu_seqlens[b] : cu_seqlens[b + 1]), and max_seqlen, a Python int (0 for no tokens).
    """
    raise NotImplementedError('ex13: your code goes here, then run `flashlib check ex13`')
