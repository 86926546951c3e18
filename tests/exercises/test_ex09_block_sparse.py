"""Grader of exercise 09 (lesson 09): sliding_window_allowed(n_q, n_k, window),
classify_blocks(allowed, block_size) and visit_lists(kinds), the tables of block-sparse attention.

Each function is first compared with flashlib.masks.BlockMask, the library's answer (its dense
rule, its ``kinds``, its ``kv_index``/``q_index`` lists), on irregular shapes: n_q != n_k, lengths
1, 17, 97, 130 that blocks of 16, 32 or 64 do not divide, windows from 1 to past the sequence,
packed documents, local + global masks and random tile patterns. Then the three run end to end:
a NumPy block-sparse FlashAttention forward (per query block, the listed key blocks, the full ones without a mask)
and backward (per key block, the listed query blocks, ``flashlib.teach.tiled.fa2_dkdv_update``) driven
by the learner's tables, against attention_ref (and autograd through it) under the dense mask;
the baseline is the same loops driven by BlockMask's tables. Probes name the mistake: off by
one in the window, top-left alignment, partial tiles called full, keys past the end counted,
floor instead of ceil, empty tiles visited, full blocks not first, lists not transposed, a tile
called FULL from its first and last rows (local + global masks, whose middle rows differ).
"""
import math

import numpy as np
import pytest
import torch

from flashlib.course import checks, grading
from flashlib import masks
from flashlib.reference import attention_naive, attention_ref
from flashlib.teach.tiled import fa2_dkdv_update, fa2_tile_update, finish, load_block, masked_scores, store_block

pytestmark = pytest.mark.ex09
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers, removed from the copy of flashlib that `flashlib grade` shows the
# learner (a call from the learner's file while graded is "not accepted"): masks' window rule,
# BlockMask's tile classification (every BlockMask's kinds come from it) and its visit lists.
# The grader's expectations come from flashlib.masks in its own process.
FLASHLIB_ANSWERS = ("flashlib.masks._window_rule", "flashlib.masks.BlockMask._classify",
                    "flashlib.masks.visit_lists")

EMPTY, PARTIAL, FULL = masks.EMPTY, masks.PARTIAL, masks.FULL
NAMES = {EMPTY: "EMPTY", PARTIAL: "PARTIAL", FULL: "FULL"}
SHAPES = [(97, 130), (130, 97), (17, 17), (1, 130), (130, 17), (1, 1)]     # (n_q, n_k)

HINT_OFF_BY_ONE = ("off by one in the window: query i (at position p = i + n_k - n_q) sees exactly "
                   "`window` keys, p - window < j <= p, itself included (window=1: only key p)")
HINT_ALIGN = ("the window is bottom-right aligned: query i sits at position p = i + n_k - n_q (the "
              "last query at the last key), not at position i")
HINT_NOT_CAUSAL = "the window is causal: no key after the query's own position p (j <= p)"
HINT_CEIL = ("there are ceil(n / block_size) blocks, not n // block_size: the last, shorter block "
             "of rows or keys is still a block, and with floor its pairs are never attended")
HINT_CEIL_PLUS_ONE = ("n // block_size + 1 blocks is one too many when n is a multiple of block_size "
                      "(128 rows in blocks of 32 are 4 blocks, not 5): there are ceil(n / "
                      "block_size) = (n + block_size - 1) // block_size")
HINT_PARTIAL_AS_FULL = ("a tile with some pairs allowed and some not is PARTIAL: calling it FULL makes "
                        "the kernel skip the mask and attend the masked keys")
HINT_EMPTY_VISITED = ("a tile with no allowed pair is EMPTY (0): the kernel never loads it, that is "
                      "the whole saving")
HINT_DROPPED = ("a tile with at least one allowed pair must be visited (PARTIAL or FULL): EMPTY "
                "drops those pairs from the attention")
HINT_PAST_END = ("keys past n_k count as not allowed: a tile running past the last key is never "
                 "FULL, or the kernel, skipping the mask, would attend the padding as if it were keys")
HINT_ROWS_PAST = ("query rows past n_q do not count: the kernel neither computes nor stores them, so "
                  "a tile whose real rows all see all its keys is FULL (no mask needed)")
HINT_FULL_AS_PARTIAL = "a tile whose every pair is allowed is FULL (2), not PARTIAL"
HINT_MIDDLE_ROWS = ("every row of a tile counts, the middle rows too: here the tile's first and last "
                    "rows see all its keys but a row between them does not (a global token's row "
                    "sees every key, its neighbours only their window: local + global is no band), "
                    "so the tile is PARTIAL; count the allowed pairs of the whole tile")
HINT_VISITS_EMPTY = ("a list names a block whose tile is EMPTY: a kernel never loads an empty block, "
                     "leave it out of the list")
HINT_MISSING = "a list leaves out a block whose tile is PARTIAL or FULL: those pairs are never attended"
HINT_ORDER = ("FULL blocks first, then PARTIAL ones, ascending within each group: the kernel walks "
              "the first n_full entries without a mask and masks the rest")
HINT_TRANSPOSE = ("q_lists is the transpose: q_lists[j] names the query blocks i whose tile (i, j) is "
                  "not EMPTY (column j of kinds), one list per key block, for the backward's dK/dV "
                  "kernel (one program per key block)")


# ---------------------------------------------------------------------------------------------
# the library's answers

def _window(n_q, n_k, window):
    """flashlib's causal sliding window, (n_q, n_k) bool."""
    return masks.sliding_window(n_q, n_k, window, block_size=16).to_dense()[0, 0].numpy()


def _block_mask(allowed, block_size):
    """A BlockMask of the element mask ``allowed`` (n_q, n_k)."""
    rows = torch.from_numpy(np.ascontiguousarray(allowed))
    return masks.BlockMask(lambda q0, q1: rows[q0:q1], *allowed.shape, block_size=block_size,
                           name="grader")


def _tables(mask):
    """kinds (nQ, nK) and the visit lists of a BlockMask's first slice, as the exercise returns them."""
    kinds = mask.kinds[0, 0].numpy().astype(np.int64)
    kv = [mask.kv_index[0, 0, i, :mask.kv_count[0, 0, i]].numpy().astype(np.int64)
          for i in range(kinds.shape[0])]
    q = [mask.q_index[0, 0, j, :mask.q_count[0, 0, j]].numpy().astype(np.int64)
         for j in range(kinds.shape[1])]
    return kinds, kv, q


def _lists_of(kinds):
    """Per row of ``kinds`` (R, C): the library's visit list (flashlib.masks' own ordering)."""
    kinds = torch.from_numpy(np.ascontiguousarray(kinds)).to(torch.int8)
    index, _, count, _ = masks.visit_lists(kinds, torch.zeros(kinds.shape, dtype=torch.int32))
    return [index[r, :count[r]].numpy().astype(np.int64) for r in range(kinds.shape[0])]


# ---------------------------------------------------------------------------------------------
# calling the learner's functions

def _call_window(impl, n_q, n_k, window):
    what = f"sliding_window_allowed({n_q}, {n_k}, {window})"
    got = np.asarray(checks.function(impl, "sliding_window_allowed")(n_q, n_k, window))
    if got.dtype != bool:
        checks.fail(f"{what} returned dtype {got.dtype}; return a bool array (True where query i "
                    "may attend key j)")
    if got.shape != (n_q, n_k):
        checks.fail(f"{what} has shape {got.shape}; expected ({n_q}, {n_k})")
    return got


def _call_classify(impl, allowed, block_size):
    n_q, n_k = allowed.shape
    what = f"classify_blocks of a {n_q} x {n_k} mask with block_size={block_size}"
    got = np.asarray(checks.function(impl, "classify_blocks")(allowed.copy(), block_size))
    want = (math.ceil(n_q / block_size), math.ceil(n_k / block_size))
    if got.shape != want:
        floor = (n_q // block_size, n_k // block_size)
        checks.fail(f"{what} has shape {got.shape}; expected {want}",
                    HINT_CEIL if got.shape == floor else
                    HINT_CEIL_PLUS_ONE if got.shape == (floor[0] + 1, floor[1] + 1) else None)
    if got.size and not np.isin(got, (EMPTY, PARTIAL, FULL)).all():
        checks.fail(f"{what} holds values {sorted(set(got.ravel().tolist()))[:6]}; tile kinds are "
                    "EMPTY 0, PARTIAL 1, FULL 2")
    return got.astype(np.int64)


def _as_lists(value, n, n_other, what):
    """A sequence of ``n`` 1-D int arrays with entries in [0, n_other)."""
    if not hasattr(value, "__len__"):
        checks.fail(f"{what} should be a list of {n} 1-D int arrays, got {type(value).__name__}")
    if len(value) != n:
        checks.fail(f"{what} has {len(value)} lists; expected {n}, one per "
                    f"{'query' if what.startswith('kv') else 'key'} block",
                    HINT_TRANSPOSE if what.startswith("q_lists") and len(value) == n_other else None)
    lists = []
    for r, entry in enumerate(value):
        arr = np.asarray(entry)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            checks.fail(f"{what}[{r}] should be a 1-D int array of block indices, got "
                        f"{arr.dtype} of shape {arr.shape}",
                        "an empty list too must be an int array: np.array([]) is float64 (a "
                        "kernel cannot index with it); build it with dtype=np.int64, e.g. "
                        "np.array(blocks, dtype=np.int64)" if arr.size == 0 else None)
        if arr.size and (arr.min() < 0 or arr.max() >= n_other):
            checks.fail(f"{what}[{r}] = {arr.tolist()} names a block outside 0..{n_other - 1}")
        lists.append(arr.astype(np.int64))
    return lists


def _call_lists(impl, kinds):
    nQ, nK = kinds.shape
    result = checks.function(impl, "visit_lists")(kinds.copy())
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        checks.fail(f"visit_lists returned {type(result).__name__}; it should return the pair "
                    "(kv_lists, q_lists)")
    return (_as_lists(result[0], nQ, nK, f"kv_lists of a {nQ} x {nK} kinds"),
            _as_lists(result[1], nK, nQ, f"q_lists of a {nQ} x {nK} kinds"))


# ---------------------------------------------------------------------------------------------
# probes: which mistake

def _window_hint(n_q, n_k, window, got):
    p = np.arange(n_q)[:, None] + (n_k - n_q)
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    wrong = [((j <= p) & (j >= p - window), HINT_OFF_BY_ONE),          # window + 1 keys
             ((j <= p) & (j > p - window + 1), HINT_OFF_BY_ONE),       # window - 1 keys
             ((j < p) & (j >= p - window), HINT_OFF_BY_ONE),           # the window before p
             ((j <= i) & (j > i - window), HINT_ALIGN),
             ((j <= i) & (j >= i - window), HINT_ALIGN),
             (np.abs(j - p) < window, HINT_NOT_CAUSAL)]
    for variant, hint in wrong:
        if np.array_equal(got, variant):
            return hint
    return None


def _classify_hint(allowed, block_size, got, want):
    """The first mismatching tile, and the likely reason."""
    n_q, n_k = allowed.shape
    nQ, nK = want.shape
    bs = block_size
    real = np.zeros((nQ * bs, nK * bs), dtype=bool)
    real[:n_q, :n_k] = True                                      # pairs inside the matrix
    count = lambda m: m.reshape(nQ, bs, nK, bs).sum(axis=(1, 3))  # noqa: E731  per tile
    all_real_allowed = count(_padded(allowed, bs)) == count(real)
    over = np.zeros(want.shape, dtype=bool)
    over[:, -1] = n_k % bs != 0                                  # the key block running past n_k
    short = np.zeros(want.shape, dtype=bool)
    short[-1, :] = n_q % bs != 0                                 # the query block running past n_q
    padded = _padded(allowed, bs)
    last = np.minimum(n_q, bs * np.arange(1, nQ + 1)) - 1        # (nQ,) last real row per block
    edge_rows_full = np.stack([padded[[r * bs, last[r]]].reshape(2, nK, bs).all(axis=(0, 2))
                               for r in range(nQ)])             # (nQ, nK)
    cases = [((got == FULL) & (want == PARTIAL) & edge_rows_full, HINT_MIDDLE_ROWS),
             ((got == FULL) & (want == PARTIAL) & ~all_real_allowed, HINT_PARTIAL_AS_FULL),
             ((got != EMPTY) & (want == EMPTY) & ~over, HINT_EMPTY_VISITED),
             ((got == EMPTY) & (want != EMPTY), HINT_DROPPED),
             ((got > want) & over, HINT_PAST_END),               # the padding counted as allowed
             ((got == PARTIAL) & (want == FULL) & short, HINT_ROWS_PAST),
             ((got == PARTIAL) & (want == FULL), HINT_FULL_AS_PARTIAL),
             (got != want, None)]
    for where, hint in cases:
        if where.any():
            r, c = np.argwhere(where)[0]
            return (f"tile ({r}, {c}) (query rows {r * bs}.., keys {c * bs}..) is "
                    f"{NAMES[int(want[r, c])]}; you said {NAMES[int(got[r, c])]}"), hint
    return None, None


def _lists_hint(name, kinds_rows, got, want):
    """The first wrong list of ``got`` (kv_lists: rows of kinds; q_lists: its columns)."""
    for r, (g, w) in enumerate(zip(got, want)):
        if np.array_equal(g, w):
            continue
        where = f"{name}[{r}] = {g.tolist()}, expected {w.tolist()}"
        if (kinds_rows[r][g] == EMPTY).any():
            return where, HINT_VISITS_EMPTY
        if len(set(g.tolist())) != len(g):
            return where, "each block once: a list names a block twice"
        if set(g.tolist()) != set(w.tolist()):
            return where, HINT_MISSING
        return where, HINT_ORDER
    return None, None


def _expect_lists(impl, kinds):
    kv, q = _call_lists(impl, kinds)
    want_kv, want_q = _lists_of(kinds), _lists_of(kinds.T)
    nQ, nK = kinds.shape
    where, hint = _lists_hint("kv_lists", kinds, kv, want_kv)
    if where:
        checks.fail(f"visit_lists of a {nQ} x {nK} kinds: {where}", hint)
    if all(np.array_equal(g, w) for g, w in zip(q, want_kv)) and \
            not all(np.array_equal(g, w) for g, w in zip(q, want_q)):
        checks.fail(f"visit_lists of a {nQ} x {nK} kinds: q_lists equals kv_lists", HINT_TRANSPOSE)
    where, hint = _lists_hint("q_lists", kinds.T, q, want_q)
    if where:
        checks.fail(f"visit_lists of a {nQ} x {nK} kinds: {where}", hint)
    return kv, q


def _diagnose(impl):
    """Run the direct probes on a few cases; the first hint found, or None."""
    for (n_q, n_k), window, bs in [((97, 130), 40, 16), ((130, 97), 33, 32), ((17, 1), 3, 16)]:
        got = _call_window(impl, n_q, n_k, window)
        if not np.array_equal(got, _window(n_q, n_k, window)):
            return _window_hint(n_q, n_k, window, got) or "see the window rule in the docstring"
        kinds, _, _ = _tables(_block_mask(got, bs))
        mine = _call_classify(impl, got, bs)
        if not np.array_equal(mine, kinds):
            return _classify_hint(got, bs, mine, kinds)[1] or "see the tile kinds in the docstring"
        try:
            _expect_lists(impl, kinds)
        except checks.CheckFailed as e:
            return str(e).split("hint: ")[-1] if "hint: " in str(e) else str(e)
    return None


# ---------------------------------------------------------------------------------------------
# NumPy block-sparse FlashAttention driven by a set of tables

def _padded(allowed, block_size):
    n_q, n_k = allowed.shape
    out = np.zeros((math.ceil(n_q / block_size) * block_size, math.ceil(n_k / block_size) * block_size),
                   dtype=bool)
    out[:n_q, :n_k] = allowed
    return out


def _tile(padded, r, c, block_size, unmasked):
    if unmasked:
        return np.ones((block_size, block_size), dtype=bool)
    return padded[r * block_size:(r + 1) * block_size, c * block_size:(c + 1) * block_size]


def _forward(q, k, v, allowed, kinds, kv_lists, block_size):
    """FA2 forward over each query block's listed key blocks: the first n_full (its FULL count)
    with no mask, the rest with their tile of ``allowed``. Returns (out, lse)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    padded = _padded(allowed, block_size)
    out, lse = np.empty(q.shape), np.empty(q.shape[:-1])
    for i, listed in enumerate(kv_lists):
        q_i = load_block(q, i * block_size, block_size)                     # (B, H, bs, D)
        m = np.full(q_i.shape[:-1], -np.inf)
        l, acc = np.zeros(q_i.shape[:-1]), np.zeros(q_i.shape)
        n_full = int((kinds[i] == FULL).sum())
        for t, j in enumerate(listed):
            mask = _tile(padded, i, j, block_size, unmasked=t < n_full)     # (bs, bs)
            s = masked_scores(q_i, load_block(k, j * block_size, block_size), scale, mask)
            m, l, acc = fa2_tile_update(s, load_block(v, j * block_size, block_size), m, l, acc)
        out_i, lse_i = finish(m, l, acc)
        store_block(out, i * block_size, out_i)
        store_block(lse, i * block_size, lse_i, axis=-1)
    return out, lse


def _backward(q, k, v, out, lse, dout, allowed, kinds, q_lists, block_size):
    """FA2 backward over each key block's listed query blocks (the first n_full unmasked).
    Returns (dq, dk, dv)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    padded = _padded(allowed, block_size)
    dq, dk, dv = np.zeros(q.shape), np.empty(k.shape), np.empty(v.shape)
    for j, listed in enumerate(q_lists):
        k_j, v_j = load_block(k, j * block_size, block_size), load_block(v, j * block_size, block_size)
        dk_j, dv_j = np.zeros(k_j.shape), np.zeros(v_j.shape)             # (B, H, bs, D)
        n_full = int((kinds[:, j] == FULL).sum())
        for t, i in enumerate(listed):
            rows = i * block_size
            mask = _tile(padded, i, j, block_size, unmasked=t < n_full)
            dk_j, dv_j, ds = fa2_dkdv_update(
                load_block(q, rows, block_size), k_j, v_j, load_block(out, rows, block_size),
                load_block(dout, rows, block_size), load_block(lse, rows, block_size, axis=-1), mask,
                scale, dk_j, dv_j)
            store_block(dq, rows, load_block(dq, rows, block_size) + scale * ds @ k_j)
        store_block(dk, j * block_size, dk_j)
        store_block(dv, j * block_size, dv_j)
    return dq, dk, dv


def _oracle(q, k, v, dout, allowed):
    """out, lse and (dq, dk, dv) of attention_ref in float64 under the dense mask, by autograd;
    and the gradients of textbook attention (the second baseline)."""
    leaves = [torch.tensor(t, requires_grad=True) for t in (q, k, v)]
    mask = torch.from_numpy(np.ascontiguousarray(allowed))
    out, lse = attention_ref(*leaves, mask=mask)
    out.backward(torch.from_numpy(dout))
    naive = [torch.tensor(t, requires_grad=True) for t in (q, k, v)]
    attention_naive(*naive, mask=mask).backward(torch.from_numpy(dout))
    return (out.detach().numpy(), lse.detach().numpy(), [t.grad.numpy() for t in leaves],
            [t.grad.nan_to_num().numpy() for t in naive])


def _expect_end_to_end(impl, rng, allowed, want_allowed, block_size, what):
    """Forward and backward on the learner's tables (built from ``allowed``) against the oracle
    under ``want_allowed``; baseline: the same loops on BlockMask's tables."""
    n_q, n_k = want_allowed.shape
    q = rng.standard_normal((1, 3, n_q, 80))
    k, v = (rng.standard_normal((1, 3, n_k, 80)) for _ in range(2))
    dout = rng.standard_normal(q.shape)
    kinds = _call_classify(impl, allowed, block_size)
    kv, ql = _call_lists(impl, kinds)
    lib_kinds, lib_kv, lib_q = _tables(_block_mask(want_allowed, block_size))
    ref_out, ref_lse, ref_grads, naive_grads = _oracle(q, k, v, dout, want_allowed)
    hint = lambda: _diagnose(impl) or "compare your tables with flashlib.masks.BlockMask's"  # noqa: E731
    out, lse = _forward(q, k, v, allowed, kinds, kv, block_size)
    base_out, base_lse = _forward(q, k, v, want_allowed, lib_kinds, lib_kv, block_size)
    where = f"block-sparse attention on your tables ({what}, block_size={block_size})"
    checks.expect_close(out, ref_out, baseline=base_out, dtype=np.dtype(np.float64),
                        name=f"out of {where}", hint=hint)
    checks.expect_close(lse, ref_lse, baseline=base_lse, dtype=np.dtype(np.float64),
                        name=f"lse of {where}", hint=hint)
    grads = _backward(q, k, v, out, lse, dout, allowed, kinds, ql, block_size)
    base = _backward(q, k, v, base_out, base_lse, dout, want_allowed, lib_kinds, lib_q, block_size)
    for name, g, e, b, n in zip(("dq", "dk", "dv"), grads, ref_grads, base, naive_grads):
        checks.expect_close(g, e, baseline=(b, n), dtype=np.dtype(np.float64),
                            name=f"{name} of {where} (the backward walks q_lists)", hint=hint)


# ---------------------------------------------------------------------------------------------
# the checks

def check_window(impl, rng):
    """sliding_window_allowed matches flashlib.masks.sliding_window (bottom-right, n_q != n_k)"""
    for n_q, n_k in SHAPES:
        for window in (1, 2, int(rng.integers(3, 40)), 200):
            got = _call_window(impl, n_q, n_k, window)
            want = _window(n_q, n_k, window)
            if not np.array_equal(got, want):
                r, c = np.argwhere(got != want)[0]
                checks.fail(f"sliding_window_allowed({n_q}, {n_k}, {window})[{r}, {c}] is {got[r, c]}, "
                            f"expected {want[r, c]}", _window_hint(n_q, n_k, window, got))


def _expect_kinds(impl, allowed, block_size, what):
    got = _call_classify(impl, allowed, block_size)
    want, _, _ = _tables(_block_mask(allowed, block_size))
    if not np.array_equal(got, want):
        where, hint = _classify_hint(allowed, block_size, got, want)
        checks.fail(f"classify_blocks of {what} ({allowed.shape[0]} x {allowed.shape[1]}, "
                    f"block_size={block_size}): {where}", hint)


def check_classify_windows(impl, rng):
    """classify_blocks on sliding windows matches BlockMask.kinds (blocks 16, 32, 64; ragged ends)"""
    for n_q, n_k in SHAPES:
        for block_size in (16, 32, 64):
            window = int(rng.choice([1, 5, 16, 40, 200]))
            _expect_kinds(impl, _window(n_q, n_k, window), block_size, f"a window of {window}")


def _random_rule(rng, n_q, n_k, block_size):
    """An element mask whose tiles are, at random, empty, full or random bits."""
    nQ, nK = math.ceil(n_q / block_size), math.ceil(n_k / block_size)
    kind = rng.integers(0, 3, (nQ, nK))
    bits = rng.random((nQ * block_size, nK * block_size)) < 0.5
    tiles = np.repeat(np.repeat(kind, block_size, 0), block_size, 1)
    return np.where(tiles == 2, True, np.where(tiles == 0, False, bits))[:n_q, :n_k]


def check_classify_any_rule(impl, rng):
    """classify_blocks on packed documents and random tile patterns matches BlockMask.kinds
    (lengths that are multiples of the block too)"""
    for n_q, n_k in [(130, 130), (1, 130), (130, 1), (17, 97), (97, 17), (128, 64)]:
        block_size = int(rng.choice([16, 32]))
        _expect_kinds(impl, _random_rule(rng, n_q, n_k, block_size), block_size, "a random pattern")
    docs = torch.from_numpy(np.repeat(np.arange(4), [40, 7, 64, 19]))         # 130 packed tokens
    for causal in (True, False):
        allowed = masks.document(docs, causal=causal, block_size=16).to_dense()[0, 0].numpy()
        _expect_kinds(impl, allowed, 16, f"packed documents of 40, 7, 64, 19 tokens (causal={causal})")


def check_classify_local_global(impl, rng):
    """classify_blocks on local + global masks (global tokens see and are seen by every token:
    a tile's middle rows can differ from its first and last) matches BlockMask.kinds"""
    for (n_q, n_k), causal, block_size in [((130, 130), False, 16), ((97, 130), False, 32),
                                           ((130, 97), True, 16)]:
        # a window past the block: row 0 (global) and the block's last row see the next tile
        window = int(rng.choice([17, 20, 33])) if block_size == 16 else 33
        n_global = int(rng.choice([1, 3, 5]))
        allowed = masks.local_global(n_q, n_k, window, n_global, causal=causal,
                                     block_size=block_size).to_dense()[0, 0].numpy()
        _expect_kinds(impl, allowed, block_size, f"a local window of {window} + {n_global} global "
                                                 f"tokens (causal={causal})")


def check_visit_lists(impl, rng):
    """visit_lists matches BlockMask's kv_index / q_index: full first, then partial, transposed"""
    cases = [masks.sliding_window(97, 130, 40, block_size=16), masks.causal(130, 97, block_size=32),
             masks.local_global(130, 130, 20, 3, block_size=16)]
    for mask in cases:
        _expect_lists(impl, _tables(mask)[0])
    for shape in [(5, 8), (7, 3), (1, 6), (6, 1), (4, 4)]:
        kinds = rng.integers(0, 3, shape)
        kinds[0] = EMPTY                                   # a query block that visits nothing
        _expect_lists(impl, kinds)


def check_end_to_end_window(impl, rng):
    """your three functions drive block-sparse attention (forward and backward) = attention_ref"""
    for (n_q, n_k), window, block_size in [((97, 130), int(rng.integers(20, 60)), 16),
                                           ((130, 97), int(rng.integers(20, 60)), 32),
                                           ((17, 17), 5, 16), ((1, 130), 100, 16)]:
        allowed = _call_window(impl, n_q, n_k, window)
        _expect_end_to_end(impl, rng, allowed, _window(n_q, n_k, window), block_size,
                           f"q {n_q}, k {n_k}, window {window}")


def check_end_to_end_documents(impl, rng):
    """your tables on packed documents (causal) drive block-sparse attention = attention_ref"""
    lengths = rng.integers([50, 1, 50, 5], [90, 10, 90, 40])     # long ones hold full tiles
    docs = torch.from_numpy(np.repeat(np.arange(4), lengths))
    allowed = masks.document(docs, causal=True, block_size=16).to_dense()[0, 0].numpy()
    _expect_end_to_end(impl, rng, allowed, allowed, 16, f"packed documents of {lengths.tolist()} tokens")


CHECKS = [check_window, check_classify_windows, check_classify_any_rule, check_classify_local_global,
          check_visit_lists,
          check_end_to_end_window, check_end_to_end_documents]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex09(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
