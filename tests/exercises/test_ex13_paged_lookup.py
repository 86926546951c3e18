"""Grader of exercise 13 (lesson 13): the Triton page_rows(pages, cols, Nk, stride_page,
stride_row, PAGE) of a paged KV cache, the host-side append_pages (the cache's bookkeeping) and
pack(lengths) of a varlen batch.

append_pages is run on copies of a used pool (stale values), a block table and a shuffled free
list holding ragged lengths (empty, on a page boundary, inside a page), for appends of one
position and of several pages; the table, both pools, the lengths and free pages returned and the
free list given are compared exactly with the grader's own rule, and a free list one page short
must raise ValueError with nothing written.

page_rows runs inside small kernels this grader owns: one stores the offsets it returns for
every position of a few key blocks (64 wide), compared with the offsets computed in Python on a
block table whose pages are out of order, in a pool whose page stride is not PAGE * row stride;
the table's row is followed by garbage entries (a page number past the pool, a negative one), so
a table load left unmasked past Nk shows as offsets outside the pool; a pool of more than 2**31
elements (offsets only, nothing loaded) catches int32 offsets. The other is a decode kernel
(one query token per sequence, grouped heads, online softmax over 64-key blocks) that loads K and
V where page_rows says, compared with attention_ref over each sequence's own keys, for pages
smaller and larger than the block. pack is compared with the offsets computed here (an empty
sequence kept, int32, B + 1 entries from 0), and flashlib.flash_attention_varlen run on its
offsets is compared with attention_ref per sequence. Through the interpreter: a few seconds.
"""
import inspect

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import KernelInterface

from flashlib import flash_attention_varlen, runtime
from flashlib.course import checks, grading
from flashlib.reference import attention_naive, attention_ref

pytestmark = pytest.mark.ex13
FLASHLIB_ALLOWED = ("flashlib",)
# flashlib's own answer, removed from the copy of flashlib that `flashlib grade` shows the learner
# (a call from the learner's file while graded is "not accepted"): the paged cache's append, the
# same bookkeeping as append_pages. page_rows has no function of its own in flashlib (the decode
# kernels' page lookup is a branch of fa2_fwd.attend_tile, which flash_attention_varlen, run by
# the grader, needs), nor has pack (flashlib's varlen functions take cu_seqlens as given).
FLASHLIB_ANSWERS = ("flashlib.decode.PagedKVCache.append",)

DEV = runtime.DEVICE
BN = 64                        # key positions per block, as the harness kernels launch them
GARBAGE = (1_000_003, -7)      # table entries past the sequence's pages
TABLE_ROOM = 256               # table buffers hold this many entries (a wrong index stays inside)

HINT_SWAPPED = ("page and row are swapped: the page is pages[cols // PAGE] (which PAGE-sized "
                "chunk of the sequence) and the row inside it is cols % PAGE")
HINT_ROW = ("the row inside the page is cols % PAGE, not cols: position j is row j % PAGE of "
            "its page")
HINT_STRIDE = ("use stride_page between pages: the pool is (num_pages, Hkv, PAGE, D), so pages "
               "are Hkv * PAGE * D elements apart, not PAGE * stride_row")
HINT_INDEX = ("the table index is cols // PAGE (the PAGE-sized chunk holding position j), and the "
              "offset page * stride_page + (cols % PAGE) * stride_row")
HINT_MASK = ("keys past the sequence's end (cols >= Nk) read the block table past the "
             "sequence's pages, where the entries are garbage: load with mask=cols < Nk, "
             "other=0, so those positions use page 0")
HINT_INT64 = ("your offsets wrap around past 2**31: convert the page to int64 before multiplying "
              "(tl.load(...).to(tl.int64)), since a pool of many pages has more than 2**31 "
              "elements")
HINT_APPEND_PAGE = ("take a page from the free list only when a position is the first of a page "
                    "(p % PAGE == 0, position 0 of an empty sequence included): one page per PAGE "
                    "positions, never one per token or one per call")
HINT_APPEND_ROW = ("position p of sequence b goes to row p % PAGE of page block_table[b, p // PAGE], "
                   "and the new key k_new[b, :, p - lengths[b]] is the one that goes there")
HINT_APPEND_ORDER = ("take pages with free.pop() (the end of the list), sequence 0 first, each "
                     "sequence's new pages in position order, and write each into block_table[b, "
                     "p // PAGE]")
HINT_APPEND_ATOMIC = ("count the pages the whole batch needs first (ceil((length + n) / PAGE) - "
                      "ceil(length / PAGE) per sequence) and raise ValueError before writing "
                      "anything when the free list is shorter")
HINT_APPEND_RETURN = ("return (new lengths, free pages left): every length grows by n, and the free "
                      "list loses exactly the pages taken; leave the free list you were given as "
                      "it was (pop from a copy)")
HINT_PACK_ZERO = ("cu_seqlens starts with 0 and has B + 1 entries: sequence b is rows "
                  "cu_seqlens[b] : cu_seqlens[b + 1] (an inclusive cumulative sum after a 0)")
HINT_PACK_EMPTY = ("an empty sequence keeps its place: its two offsets are equal "
                   "(lengths [3, 0, 5] -> [0, 3, 3, 8])")
HINT_PACK_DTYPE = "cu_seqlens must be int32 (flash-attn's and flashlib's layout)"
HINT_PACK_MAX = "max_seqlen is the longest sequence's length (a Python int), not the total"


# ---------------------------------------------------------------------------------------------
# the learner's functions

def _page_rows(impl):
    """The learner's page_rows, checked to be a @triton.jit function that is not the stub."""
    fn = getattr(impl, "page_rows", None)
    if fn is None:
        checks.fail("your file defines no function page_rows: keep the name and signature "
                    "from the stub")
    if not isinstance(fn, KernelInterface):
        checks.fail("page_rows is a plain Python function: decorate it with @triton.jit, since "
                    "the decode kernel calls it from inside the kernel")
    if "raise NotImplementedError" in inspect.getsource(fn.fn):
        raise NotImplementedError("ex13: page_rows is still the stub")
    params = list(inspect.signature(fn.fn).parameters)
    if len(params) != 6:
        checks.fail(f"page_rows takes {params}; keep the stub's signature "
                    "(pages, cols, Nk, stride_page, stride_row, PAGE: tl.constexpr)")
    return fn


@triton.jit
def _offsets_kernel(Table, Out, Nk, stride_page, stride_row,
                    BN: tl.constexpr, PAGE: tl.constexpr, PAGE_ROWS: tl.constexpr):
    """Out[j] = PAGE_ROWS(...)[j] for the positions j of this program's block of BN."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)                     # (BN,)
    rows = PAGE_ROWS(Table, cols, Nk, stride_page, stride_row, PAGE)     # (BN,)
    tl.store(Out + cols, rows)


def _offsets(fn, table_row, Nk, stride_page, stride_row, page, blocks):
    """The learner's offsets (int64 NumPy, blocks * BN) for one table row (a Python list)."""
    padded = table_row + [GARBAGE[i % 2] for i in range(TABLE_ROOM - len(table_row))]
    table = torch.tensor(padded, dtype=torch.int32, device=DEV)    # room for any index < 256
    out = torch.zeros(blocks * BN, dtype=torch.int64, device=DEV)
    _offsets_kernel[(blocks,)](table, out, Nk, stride_page, stride_row, BN=BN, PAGE=page,
                               PAGE_ROWS=fn)
    return out.cpu().numpy()


def _expected(table_row, cols, stride_page, stride_row, page):
    pages = np.asarray(table_row, dtype=np.int64)[cols // page]
    return pages * stride_page + (cols % page) * stride_row


def _offset_hint(table_row, cols, got, stride_page, stride_row, page):
    """Which formula the learner's offsets follow."""
    t = np.asarray(table_row, dtype=np.int64)
    wrong = {
        HINT_SWAPPED: t[np.minimum(cols % page, len(t) - 1)] * stride_page + (cols // page) * stride_row,
        HINT_ROW: t[cols // page] * stride_page + cols * stride_row,
        HINT_STRIDE: t[cols // page] * page * stride_row + (cols % page) * stride_row,
    }
    for hint, offsets in wrong.items():
        if np.array_equal(got, offsets):
            return hint
    return HINT_INDEX


def _table(rng, n_used, num_pages, extra=4):
    """A row of n_used distinct pages of the pool, out of order, then garbage entries."""
    used = rng.permutation(num_pages)[:n_used].tolist()
    return used + [GARBAGE[i % 2] for i in range(extra)]


# ---------------------------------------------------------------------------------------------
# part (a): the offsets

def check_offsets(impl, rng):
    """offsets inside the sequence: row j % PAGE of page pages[j // PAGE], pages out of order

    (pages of 16 and 128 rows, a page stride that is not PAGE rows)"""
    fn = _page_rows(impl)
    for page, Nk in ((16, 100), (128, 150)):
        stride_row, stride_page = 24, 3 * page * 24        # pool (num_pages, 3 heads, page, 24)
        table = _table(rng, -(-Nk // page), 40)
        blocks = -(-Nk // BN)
        got = _offsets(fn, table, Nk, stride_page, stride_row, page, blocks)[:Nk]
        cols = np.arange(Nk)
        want = _expected(table, cols, stride_page, stride_row, page)
        if not np.array_equal(got, want):
            j = int(np.flatnonzero(got != want)[0])
            checks.fail(f"PAGE={page}, Nk={Nk}, table {table[:-4]}, stride_page={stride_page}, "
                        f"stride_row={stride_row}: position {j} gives offset {got[j]}, "
                        f"expected {want[j]} (page {table[j // page]}, row {j % page})",
                        _offset_hint(table, cols, got, stride_page, stride_row, page))


def check_past_the_end(impl, rng):
    """keys past the sequence's end (j >= Nk) do not read the block table past its pages"""
    fn = _page_rows(impl)
    num_pages, stride_row = 12, 16
    stride_page = 2 * 16 * stride_row
    for page, Nk in ((16, 48), (16, 37), (32, 1)):         # a full last page, a ragged one, one key
        table = _table(rng, -(-Nk // page), num_pages, extra=8)
        got = _offsets(fn, table, Nk, stride_page, stride_row, page, blocks=2)
        cols = np.arange(2 * BN)
        outside = (cols >= Nk) & ((got < 0) | (got >= num_pages * stride_page))
        if outside.any():
            j = int(np.flatnonzero(outside)[0])
            checks.fail(f"PAGE={page}, Nk={Nk}: position {j} (past the end) gives offset {got[j]}, "
                        f"outside the pool of {num_pages} pages; the table holds "
                        f"{len(table) - 8} pages, then garbage {table[-8:-6]}", HINT_MASK)
        inside = cols < Nk
        want = _expected(table[:len(table) - 8], cols[inside], stride_page, stride_row, page)
        if not np.array_equal(got[inside], want):
            checks.fail(f"PAGE={page}, Nk={Nk}: wrong offsets inside the sequence",
                        _offset_hint(table, cols[inside], got[inside], stride_page, stride_row, page))


def check_int64(impl, rng):
    """offsets past 2**31 elements (a pool of 100 pages of 2**25 elements) are int64"""
    fn = _page_rows(impl)
    page, Nk, stride_row = 16, 64, 256
    stride_page = 2 ** 25 + 2 * page * stride_row
    table = (90 + rng.permutation(10)[:4]).tolist()                    # pages 90-99, past 2**31
    got = _offsets(fn, table, Nk, stride_page, stride_row, page, blocks=1)
    want = _expected(table, np.arange(Nk), stride_page, stride_row, page)
    if not np.array_equal(got, want):
        j = int(np.flatnonzero(got != want)[0])
        hint = HINT_INT64 if np.array_equal(got, want.astype(np.int32).astype(np.int64)) or \
            (got < 0).any() else _offset_hint(table, np.arange(Nk), got, stride_page, stride_row, page)
        checks.fail(f"position {j} in page {table[j // page]} (stride_page={stride_page}) gives "
                    f"offset {got[j]}, expected {want[j]}", hint)


# ---------------------------------------------------------------------------------------------
# part (a): a decode kernel around the lookup

@triton.jit
def _decode_kernel(Q, K, V, Table, Lens, Out, stride_tb, stride_qb, stride_qh,
                   stride_kp, stride_kh, stride_kn, stride_vp, stride_vh, stride_vn, qk_scale,
                   pool_size,
                   GROUP: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, PAGE: tl.constexpr,
                   PAGE_ROWS: tl.constexpr):
    """One program per (sequence, query head): one query token over its paged keys."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    Nk = tl.load(Lens + b)
    d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + d)                   # (D,)
    pages = Table + b * stride_tb
    k_base = K + (h // GROUP) * stride_kh
    v_base = V + (h // GROUP) * stride_vh
    m_i = tl.max(tl.full((BN,), float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros((BN,), tl.float32), 0)
    acc = tl.zeros((D,), tl.float32)
    for start in range(0, Nk, BN):
        cols = start + tl.arange(0, BN)                                  # (BN,)
        valid = cols < Nk
        k_rows = PAGE_ROWS(pages, cols, Nk, stride_kp, stride_kn, PAGE)  # (BN,)
        v_rows = PAGE_ROWS(pages, cols, Nk, stride_vp, stride_vn, PAGE)
        # the harness's own guard: an offset outside the pool loads 0 instead of a wild read
        k_in = valid & (k_rows >= 0) & (k_rows < pool_size)
        v_in = valid & (v_rows >= 0) & (v_rows < pool_size)
        k = tl.load(k_base + k_rows[:, None] + d[None, :], mask=k_in[:, None], other=0.0)
        v = tl.load(v_base + v_rows[:, None] + d[None, :], mask=v_in[:, None], other=0.0)
        s = tl.where(valid, tl.sum(k * q[None, :], 1) * qk_scale, float("-inf"))   # (BN,)
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)                    # (D,)
        m_i = m_new
    out = tl.where(l_i > 0, acc / tl.maximum(l_i, 1e-30), 0.0)
    tl.store(Out + b * stride_qb + h * stride_qh + d, out)


def _paged(rng, k, page, num_pages):
    """k (B, Hkv, L, D) cut into pages scattered over a pool; returns pool, int32 table."""
    B, Hkv, L, D = k.shape
    n = L // page
    table = torch.from_numpy(rng.permutation(num_pages)[:B * n].reshape(B, n).astype(np.int32))
    pool = torch.from_numpy(rng.standard_normal((num_pages, Hkv, page, D))).float()
    pool[table.reshape(-1).long()] = k.reshape(B, Hkv, n, page, D).transpose(1, 2).reshape(-1, Hkv, page, D)
    return pool, table


def check_decode(impl, rng):
    """a decode kernel on your lookup matches attention_ref (ragged, pages out of order)

    (pages smaller and larger than the 64-key block, grouped heads, an empty sequence)"""
    fn = _page_rows(impl)
    D = 32
    for page, lens, Hq, Hkv in ((16, [100, 1, 64], 4, 2), (128, [140, 0], 2, 1)):
        B = len(lens)
        L = -(-max(lens) // page) * page
        q = torch.from_numpy(rng.standard_normal((B, Hq, 1, D))).float()
        k, v = (torch.from_numpy(rng.standard_normal((B, Hkv, L, D))).float() for _ in range(2))
        num_pages = 3 * B * (L // page)
        k_pool, table = _paged(rng, k, page, num_pages)
        v_pool = torch.from_numpy(rng.standard_normal(k_pool.shape)).float()
        v_pool[table.reshape(-1).long()] = v.reshape(B, Hkv, L // page, page, D).transpose(1, 2) \
            .reshape(-1, Hkv, page, D)
        room = torch.full((B, TABLE_ROOM), GARBAGE[0], dtype=torch.int32)
        room[:, :table.shape[1]] = table          # garbage after each row: a wrong index shows
        qd, kd, vd, td = (t.to(DEV) for t in (q, k_pool, v_pool, room))
        out = torch.zeros_like(qd)
        _decode_kernel[(B, Hq)](qd, kd, vd, td, torch.tensor(lens, dtype=torch.int32, device=DEV),
                                out, td.stride(0), qd.stride(0), qd.stride(1), *kd.stride()[:3],
                                *vd.stride()[:3], D ** -0.5,
                                kd.numel() - (Hkv - 1) * kd.stride(1) - D + 1,   # offsets < this
                                GROUP=Hq // Hkv, D=D, BN=BN, PAGE=page,
                                PAGE_ROWS=fn)
        out = out.cpu()
        for b, n in enumerate(lens):
            what = f"sequence {b} (Nk={n}, PAGE={page}, table {table[b].tolist()})"
            if n == 0:
                if not torch.equal(out[b], torch.zeros_like(out[b])):
                    checks.fail(f"{what}: an empty sequence must give 0")
                continue
            sl = (slice(b, b + 1), slice(None), slice(0, n))
            ref, _ = attention_ref(q[b:b + 1], k[sl], v[sl])
            base = attention_naive(q[b:b + 1], k[sl], v[sl])
            checks.expect_close(out[b:b + 1], ref, baseline=base, dtype=torch.float32,
                                name=f"out of {what}", hint=lambda: _diagnose(fn, rng))


def _diagnose(fn, rng):
    """A hint from the offsets probe, for a decode that went wrong."""
    try:
        check_offsets(type("impl", (), {"page_rows": fn}), rng)
        check_past_the_end(type("impl", (), {"page_rows": fn}), rng)
    except checks.CheckFailed as e:
        return str(e).split("hint: ")[-1]
    return None


# ---------------------------------------------------------------------------------------------
# part (b): pack

def _pack(impl, lengths):
    pack = checks.function(impl, "pack")
    result = pack(list(lengths))
    if not (isinstance(result, tuple) and len(result) == 2):
        checks.fail(f"pack({list(lengths)}) returned {type(result).__name__}; return the pair "
                    "(cu_seqlens, max_seqlen)")
    cu, max_seqlen = result
    if not isinstance(cu, torch.Tensor):
        checks.fail(f"pack({list(lengths)}): cu_seqlens is a {type(cu).__name__}; return a torch "
                    "tensor", HINT_PACK_DTYPE)
    return cu.cpu(), max_seqlen


def _pack_hint(lengths, got):
    got = got.tolist()
    kept = [n for n in lengths if n]
    if len(kept) < len(lengths) and got == np.concatenate([[0], np.cumsum(kept)]).tolist():
        return HINT_PACK_EMPTY
    if len(got) == len(lengths) or (got and got[0] != 0):
        return HINT_PACK_ZERO
    if len(got) < len(lengths) + 1:
        return HINT_PACK_EMPTY
    return HINT_PACK_ZERO


def check_pack(impl, rng):
    """pack(lengths): int32 cu_seqlens, B + 1 offsets from 0, empty sequences kept; max_seqlen"""
    cases = [[3, 0, 5], [int(n) for n in rng.integers(0, 40, 6)] + [0, 1], [7]]
    for lengths in cases:
        cu, max_seqlen = _pack(impl, lengths)
        want = np.concatenate([[0], np.cumsum(lengths)])
        if cu.dtype != torch.int32:
            checks.fail(f"pack({lengths}): cu_seqlens is {cu.dtype}", HINT_PACK_DTYPE)
        if cu.shape != (len(lengths) + 1,) or not np.array_equal(cu.numpy(), want):
            checks.fail(f"pack({lengths}): cu_seqlens is {cu.tolist()}, expected {want.tolist()}",
                        _pack_hint(lengths, cu))
        if isinstance(max_seqlen, torch.Tensor) or int(max_seqlen) != max(lengths):
            checks.fail(f"pack({lengths}): max_seqlen is {max_seqlen!r}, expected {max(lengths)}",
                        HINT_PACK_MAX)


def check_pack_varlen(impl, rng):
    """flash_attention_varlen on your offsets matches attention_ref, sequence by sequence

    (causal, an empty and a one-token sequence)"""
    lengths = [int(rng.integers(20, 70)), 0, 1, int(rng.integers(5, 40))]
    cu, max_seqlen = _pack(impl, lengths)
    H, D, total = 1, 16, sum(lengths)
    q, k, v = (torch.from_numpy(rng.standard_normal((total, H, D))).float() for _ in range(3))
    try:
        out = flash_attention_varlen(q.to(DEV), k.to(DEV), v.to(DEV), cu.to(DEV), cu.to(DEV),
                                     max_seqlen, max_seqlen, causal=True).cpu()
    except (ValueError, TypeError) as e:
        checks.fail(f"flash_attention_varlen refuses pack({lengths}): {e}", HINT_PACK_ZERO)
    start = 0
    for b, n in enumerate(lengths):
        if n:
            seq = [t[start:start + n].transpose(0, 1)[None] for t in (q, k, v)]   # (1, H, n, D)
            ref, _ = attention_ref(*seq, causal=True)
            checks.expect_close(out[start:start + n].transpose(0, 1)[None], ref,
                                baseline=attention_naive(*seq, causal=True), dtype=torch.float32,
                                name=f"sequence {b} (length {n}) of the packed batch")
        start += n


def _append_one(k_pages, v_pages, table, b, start, free, k_seq, v_seq):
    """The docstring's rule for one sequence: k_seq, v_seq (Hkv, n, D) after ``start`` positions."""
    PAGE = k_pages.shape[2]
    for i in range(k_seq.shape[1]):
        p = start + i
        if p % PAGE == 0:                                        # a page's first position
            table[b, p // PAGE] = free.pop()
        k_pages[int(table[b, p // PAGE]), :, p % PAGE] = k_seq[:, i]
        v_pages[int(table[b, p // PAGE]), :, p % PAGE] = v_seq[:, i]


def _append_reference(k_pages, v_pages, table, lengths, free, k_new, v_new):
    """The grader's own append, in place on the copies it is given."""
    for b, start in enumerate(lengths):
        _append_one(k_pages, v_pages, table, b, start, free, k_new[b], v_new[b])
    return [start + k_new.shape[2] for start in lengths], free


def _append_state(rng, PAGE, lengths, spare):
    """A used pool (stale values, never zeros), block table (-1: no page) and free list (in any
    order) holding ``lengths`` positions, written by the reference."""
    Hkv, D, max_pages = 2, 3, 8
    num_pages = sum(-(-n // PAGE) for n in lengths) + spare
    k_pages, v_pages = (torch.from_numpy(rng.standard_normal((num_pages, Hkv, PAGE, D))).float()
                        for _ in range(2))
    table = torch.full((len(lengths), max_pages), -1, dtype=torch.int32)
    free = [int(x) for x in rng.permutation(num_pages)]
    for b, n in enumerate(lengths):
        seq = torch.from_numpy(rng.standard_normal((Hkv, n, D))).float()
        _append_one(k_pages, v_pages, table, b, 0, free, seq, -seq)
    return k_pages, v_pages, table, free


def _expect_append(impl, rng, PAGE, lengths, n, where):
    needed = sum(-(-(start + n) // PAGE) - -(-start // PAGE) for start in lengths)
    spare = needed + len(lengths) * (n + 1)     # room for a wasteful answer: it shows in the table
    k_pages, v_pages, table, free = _append_state(rng, PAGE, lengths, spare=spare)
    B, Hkv, D = len(lengths), k_pages.shape[1], k_pages.shape[3]
    k_new, v_new = (torch.from_numpy(rng.standard_normal((B, Hkv, n, D))).float() for _ in range(2))
    want = [t.clone() for t in (k_pages, v_pages, table)]
    want_lengths, want_free = _append_reference(*want, list(lengths), list(free), k_new, v_new)
    got = [t.clone() for t in (k_pages, v_pages, table)]
    free_given = list(free)
    result = checks.function(impl, "append_pages")(*got, list(lengths), free_given, k_new.clone(),
                                                   v_new.clone())
    what = f"append_pages of {n} positions to lengths {list(lengths)} (PAGE {PAGE}){where}"
    if not torch.equal(got[2], want[2]):
        taken = [int(x) for x in got[2][got[2] != table]]
        due = [int(x) for x in want[2][want[2] != table]]
        hint = HINT_APPEND_PAGE if len(taken) != len(due) else HINT_APPEND_ORDER
        checks.fail(f"{what}: the block table is {got[2].tolist()}, expected {want[2].tolist()} "
                    f"(pages taken {taken}, expected {due})", hint)
    for name, g, w in (("k_pages", got[0], want[0]), ("v_pages", got[1], want[1])):
        if not torch.equal(g, w):
            page, head, row = (int(i) for i in (g != w).nonzero()[0][:3])
            checks.fail(f"{what}: {name}[{page}, {head}, {row}] is wrong after the append", HINT_APPEND_ROW)
    if not isinstance(result, (tuple, list)) or len(result) != 2 or \
            [int(x) for x in result[0]] != want_lengths or [int(x) for x in result[1]] != want_free:
        checks.fail(f"{what}: returned {result!r}; expected ({want_lengths}, {want_free})",
                    HINT_APPEND_RETURN)
    if free_given != list(free):
        checks.fail(f"{what}: the free list given was changed", HINT_APPEND_RETURN)


def check_append_pages(impl, rng):
    """append_pages: pages taken only at a page's first position (empty sequences, lengths on a page
    boundary, appends of 1 and of several pages), from the free list's end in sequence order;
    every new key and value in its page's row; other pages and table entries untouched"""
    for PAGE in (4, 8):
        lengths = [0, PAGE, int(rng.integers(1, PAGE)), int(rng.integers(PAGE + 1, 3 * PAGE))]
        for n in (1, int(rng.integers(2 * PAGE + 1, 3 * PAGE))):
            _expect_append(impl, rng, PAGE, lengths, n, "")


def check_append_out_of_pages(impl, rng):
    """append_pages raises ValueError, changing nothing, when the free list is short of the pages
    the batch needs (the first sequences' pages would fit)"""
    PAGE, lengths, n = 4, [0, 3, 5], 6
    k_pages, v_pages, table, free = _append_state(rng, PAGE, lengths, spare=0)
    needed = sum(-(-(s + n) // PAGE) - -(-s // PAGE) for s in lengths)
    free = free + list(range(k_pages.shape[0], k_pages.shape[0] + needed - 1))   # one short
    pool = [torch.cat([t, torch.from_numpy(rng.standard_normal((needed, *t.shape[1:]))).float()])
            for t in (k_pages, v_pages)]                       # pages for the free list's ids
    got = [t.clone() for t in (*pool, table)]
    fn = checks.function(impl, "append_pages")
    k_new = torch.from_numpy(rng.standard_normal((3, 2, n, 3))).float()
    try:
        fn(*got, list(lengths), list(free), k_new, k_new.clone())
    except ValueError:
        pass
    else:
        checks.fail(f"append_pages of {n} positions to lengths {lengths} (PAGE {PAGE}) with "
                    f"{len(free)} free pages for {needed} needed did not raise ValueError",
                    HINT_APPEND_ATOMIC)
    if not all(torch.equal(g, w) for g, w in zip(got, (*pool, table))):
        checks.fail("append_pages raised, but changed the pool or the block table first",
                    HINT_APPEND_ATOMIC)


CHECKS = [check_offsets, check_past_the_end, check_int64, check_decode, check_append_pages,
          check_append_out_of_pages, check_pack, check_pack_varlen]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex13(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
