"""Hostile (issue 55): reaches flashlib's own answer to ex13's append_pages (PagedKVCache.append,
the same bookkeeping) by a name built at run time, which no static check sees; page_rows and
pack are left wrong (no points from them). Expected: 0 points, "error: RuntimeError:
flashlib.decode.PagedKVCache.append is flashlib's own answer ..." (the answer is not in the copy
of flashlib it sees)."""
import pkgutil

import flashlib  # noqa: F401
import torch
import triton
import triton.language as tl

_Cache = pkgutil.resolve_name("flashlib." + "decode:PagedKVCache")


@triton.jit
def page_rows(pages, cols, Nk, stride_page, stride_row, PAGE: tl.constexpr):
    return cols * stride_row


def append_pages(k_pages, v_pages, block_table, lengths, free, k_new, v_new):
    cache = object.__new__(_Cache)
    cache.k, cache.v, cache._table, cache.block_table = k_pages, v_pages, block_table, block_table
    cache._lengths, cache._free = [int(x) for x in lengths], list(free)
    cache.seqlens = torch.tensor(cache._lengths, dtype=torch.int32)
    cache.append(k_new, v_new)
    return cache.lengths, cache._free


def pack(lengths):
    return torch.zeros(len(lengths) + 1, dtype=torch.int32), 0
