"""Hostile (issue 55): ex13's append_pages by PagedKVCache.append (the same bookkeeping), taken
from flashlib's source file executed afresh under a new name (what withholding the answer at run
time did not stop); page_rows and pack are left wrong (no points from them). Expected: 0 points,
"error: RuntimeError: flashlib.decode.PagedKVCache.append is flashlib's own answer ..." (the
answer is not in the files it can see)."""
import pkgutil

import flashlib  # noqa: F401
import torch
import triton
import triton.language as tl

run = pkgutil.resolve_name("builtins:" + "ex" + "ec")


def _reexecuted(name):
    """flashlib's module ``name`` executed afresh from its source file, under a new name."""
    module = pkgutil.resolve_name(name)
    space = {"__name__": "borrowed_" + name.rsplit(".", 1)[-1], "__file__": module.__file__,
             "__package__": module.__package__}
    with open(module.__file__) as f:
        run(compile(f.read(), module.__file__, "exec"), space)
    return space


_Cache = _reexecuted("flashlib.decode")["PagedKVCache"]


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
