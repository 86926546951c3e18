"""FlashAttention in NumPy: the one-pass recurrence, FA1 Algorithm 1, FA2's loop order, and the
tiled backward, written to be read next to the papers (lessons 03 and 04).

- ``standard_attention``: materialises S and P (paper FA1, section 2.2, Algorithm 0).
- ``online_attention``: one key at a time, the running (m, l, acc) recurrence (lesson 03);
  ``merge_states``: two partial results over disjoint keys combined by their lse.
- ``fa1_forward``: FlashAttention-1, arXiv 2205.14135, Algorithm 1: KV blocks outer, Q blocks
  inner, O / l / m live in full-size "HBM" arrays read and written back at every step, and O is
  kept normalised (rescaled by diag(l_new)^-1 every step).
- ``fa2_forward`` + ``fa2_tile_update``: FlashAttention-2, arXiv 2307.08691, Algorithm 1: Q
  blocks outer, KV blocks inner, the running state stays "on chip", normalisation deferred to
  the end, lse = m + log(l); KV blocks above the causal diagonal are skipped.
- ``fa2_backward`` + ``fa2_dkdv_update``: FA2 Algorithm 2: recompute P from lse, KV blocks
  outer (lesson 08).

Conventions (as ``flashlib.reference``): arrays (..., N, D) with the same leading dims for q, k,
v (no grouped heads here); float32 or float64, computed in that dtype; ``causal`` is bottom-right
aligned: query i sees key j iff j <= i + Nk - Nq; scale defaults to 1/sqrt(D); a row with
nothing to attend to gives out = 0 and lse = -inf, without NaN or warnings.

Tiles have a fixed shape, like a GPU kernel's: the last block along N is padded with zeros (a
masked load) and its missing keys are masked with -inf, so any N and any block size work.
Limits: readable, not fast (Python loops over blocks); no dropout, no GQA.
"""

import numpy as np

from ..inputs import resolve_scale

__all__ = ["standard_attention", "online_attention", "merge_states", "fa1_forward",
           "fa2_tile_update", "fa2_forward", "fa2_dkdv_update", "fa2_backward",
           "causal_block_range", "block_schedule", "tile_mask"]


def as_float_arrays(q, k, v):
    """Validate (..., N, D) arrays; return them in one float dtype. Errors name the argument."""
    q, k, v = (np.asarray(t) for t in (q, k, v))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., seqlen, headdim), got {t.shape}")
        if not np.issubdtype(t.dtype, np.floating):
            raise TypeError(f"{name} must be a float array (float32 or float64), got {t.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {k.shape} and v {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k {k.shape} must match q {q.shape} in leading dims and headdim")
    dtype = np.result_type(q, k, v)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)


def tile_mask(q_start, k_start, block_q, block_k, Nq, Nk, causal):
    """(block_q, block_k) bool, True where query q_start+r may attend key k_start+c.

    The one masking rule of this module: padded rows/columns past Nq/Nk are never attended, and
    with ``causal`` key j is visible from query i iff j <= i + Nk - Nq (bottom-right).
    """
    i = q_start + np.arange(block_q)[:, None]   # (Bq, 1) query positions
    j = k_start + np.arange(block_k)[None, :]   # (1, Bk) key positions
    allowed = (i < Nq) & (j < Nk)
    if causal:
        allowed = allowed & (j <= i + (Nk - Nq))
    return allowed


def causal_block_range(q_start, q_stop, Nq, Nk, block_k):
    """KV block indices that queries [q_start, q_stop) can see under the bottom-right causal rule.

    Blocks after it lie entirely above the diagonal and are skipped (the FA2 paper's "causal
    masking" paragraph). No block before it is ever fully masked, so only the end moves;
    q_start is kept for symmetry (a sliding window would move the start too).
    """
    n_blocks = -(-Nk // block_k)
    last_key = min(q_stop, Nq) - 1 + (Nk - Nq)   # the last key the last query row may see
    if last_key < 0:
        return range(0)
    return range(min(n_blocks, last_key // block_k + 1))


def block_schedule(Nq, Nk, *, block_q=64, block_k=64, causal=False):
    """(n_q_blocks, n_k_blocks) bool: which tiles fa2_forward visits (for lessons to draw)."""
    n_q, n_k = -(-Nq // block_q), -(-Nk // block_k)
    visited = np.zeros((n_q, n_k), dtype=bool)
    for qb in range(n_q):
        q_start = qb * block_q
        visited[qb, list(kv_blocks(q_start, q_start + block_q, Nq, Nk, block_k, causal))] = True
    return visited


def kv_blocks(q_start, q_stop, Nq, Nk, block_k, causal):
    if causal:
        return causal_block_range(q_start, q_stop, Nq, Nk, block_k)
    return range(-(-Nk // block_k))


def load_block(x, start, size, *, axis=-2, fill=0.0):
    """x[start:start+size] along ``axis``, padded with ``fill`` past the end (a masked load)."""
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, start + size)
    block = x[tuple(index)]
    missing = size - block.shape[axis]
    if missing:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, missing)
        block = np.pad(block, pad, constant_values=fill)
    return block


def store_block(dst, start, block, *, axis=-2):
    """dst[start:...] = block along ``axis``, dropping the padded tail (a masked store)."""
    stop = min(start + block.shape[axis], dst.shape[axis])
    index = [slice(None)] * dst.ndim
    index[axis] = slice(start, stop)
    src = [slice(None)] * dst.ndim
    src[axis] = slice(0, stop - start)
    dst[tuple(index)] = block[tuple(src)]


def safe(m):
    """The running max with -inf replaced by 0: exp(s - safe(m)) is 0, not NaN, on empty rows."""
    return np.where(np.isneginf(m), 0.0, m)


def masked_scores(q_block, k_block, scale, mask):
    s = (q_block @ np.swapaxes(k_block, -1, -2)) * scale   # (..., Bq, Bk)
    return np.where(mask, s, -np.inf)


def logsumexp_from(m, l):
    """lse = m + log(l) from a (max, sum) state; -inf for an empty row (l = 0), no warning."""
    return np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)


def finish(m, l, acc):
    """Deferred normalisation: out = acc / l and the lse; empty rows (l = 0, acc = 0) -> 0."""
    out = acc / np.where(l > 0, l, 1.0)[..., None]
    return out, logsumexp_from(m, l)


def merge_states(out_a, lse_a, out_b, lse_b):
    """Merge two partial results over disjoint keys (lesson 03): out_* (..., D) each normalised
    over its own keys, lse_* (...) natural log, -inf for a part with no key (its out is 0).
    Returns (out, lse) over both: lse = log(e^lse_a + e^lse_b), out = sum_part e^(lse_part - lse)
    out_part; a row empty in both gets out = 0 and lse = -inf, without NaN or warnings."""
    m = safe(np.maximum(lse_a, lse_b))                            # (...) both empty: 0
    w_a, w_b = np.exp(lse_a - m), np.exp(lse_b - m)               # (...) each <= 1
    total = w_a + w_b                                             # (...) 0: both empty
    out = w_a[..., None] * out_a + w_b[..., None] * out_b         # (..., D)
    return out / np.where(total > 0, total, 1)[..., None], logsumexp_from(m, total)


def standard_attention(q, k, v, *, causal=False, scale=None):
    """S = scale Q K^T and P = softmax(S) materialised, (..., Nq, Nk) memory. Returns (out, lse)."""
    q, k, v = as_float_arrays(q, k, v)
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    s = masked_scores(q, k, resolve_scale(scale, D), tile_mask(0, 0, Nq, Nk, Nq, Nk, causal))
    m = s.max(axis=-1)                                            # (..., Nq)
    p = np.exp(s - safe(m)[..., None])                            # (..., Nq, Nk)
    return finish(m, p.sum(axis=-1), p @ v)


def online_attention(q, k, v, *, scale=None, causal=False):
    """One pass over the keys, one at a time, keeping per query row the running max m, the sum
    l of exp(s - m) and the unnormalised output acc; rescale both by exp(m_old - m_new) whenever
    the max grows. Returns (out, lse)."""
    q, k, v = as_float_arrays(q, k, v)
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = resolve_scale(scale, D)
    m = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)             # (..., Nq)
    l = np.zeros(q.shape[:-1], dtype=q.dtype)                     # (..., Nq)
    acc = np.zeros(q.shape, dtype=q.dtype)                        # (..., Nq, D)
    for j in range(Nk):
        s = (q @ k[..., j, :, None])[..., 0] * scale              # (..., Nq) scores with key j
        s = np.where(tile_mask(0, j, Nq, 1, Nq, Nk, causal)[:, 0], s, -np.inf)
        m_new = np.maximum(m, s)
        alpha = np.exp(m - safe(m_new))                           # rescales the old state
        p = np.exp(s - safe(m_new))                               # weight of key j
        l = alpha * l + p
        acc = alpha[..., None] * acc + p[..., None] * v[..., j, None, :]
        m = m_new
    return finish(m, l, acc)


def fa1_forward(q, k, v, *, block_q=64, block_k=64, causal=False, scale=None):
    """FlashAttention-1, Algorithm 1 (KV blocks outer). Returns (out, lse)."""
    q, k, v = as_float_arrays(q, k, v)
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = resolve_scale(scale, D)
    # line 2: O, l, m in "HBM", full size; every inner step reads its rows and writes them back
    O = np.zeros(q.shape, dtype=q.dtype)                          # (..., Nq, D)
    l = np.zeros(q.shape[:-1], dtype=q.dtype)                     # (..., Nq)
    m = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)             # (..., Nq)
    for k_start in range(0, Nk, block_k):
        k_j = load_block(k, k_start, block_k)                     # (..., Bk, D)
        v_j = load_block(v, k_start, block_k)                     # (..., Bk, D)
        for q_start in range(0, Nq, block_q):
            if causal and k_start // block_k not in causal_block_range(
                    q_start, q_start + block_q, Nq, Nk, block_k):
                continue                                          # tile fully above the diagonal
            q_i = load_block(q, q_start, block_q)                 # (..., Bq, D)
            o_i = load_block(O, q_start, block_q)                 # (..., Bq, D)
            l_i = load_block(l, q_start, block_q, axis=-1)        # (..., Bq)
            m_i = load_block(m, q_start, block_q, axis=-1, fill=-np.inf)
            mask = tile_mask(q_start, k_start, block_q, block_k, Nq, Nk, causal)
            s_ij = masked_scores(q_i, k_j, scale, mask)           # (..., Bq, Bk)
            m_tilde = s_ij.max(axis=-1)                           # (..., Bq)
            p_tilde = np.exp(s_ij - safe(m_tilde)[..., None])     # (..., Bq, Bk)
            l_tilde = p_tilde.sum(axis=-1)
            m_new = np.maximum(m_i, m_tilde)
            old, new = np.exp(m_i - safe(m_new)), np.exp(m_tilde - safe(m_new))
            l_new = old * l_i + new * l_tilde
            l_div = np.where(l_new > 0, l_new, 1.0)[..., None]   # empty rows stay 0
            # O_i <- diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i + e^{m~ - m_new} P~ V_j)
            o_i = ((l_i * old)[..., None] * o_i + new[..., None] * (p_tilde @ v_j)) / l_div
            store_block(O, q_start, o_i)
            store_block(l, q_start, l_new, axis=-1)
            store_block(m, q_start, m_new, axis=-1)
    return O, logsumexp_from(m, l)                                # O is already normalised


def fa2_tile_update(scores, v_block, m, l, acc):
    """One step of FA2's inner loop for a block of query rows (deferred normalisation).

    scores (..., Bq, Bk): scaled, -inf where masked; v_block (..., Bk, D); m (..., Bq) running
    max; l (..., Bq) running sum of exp(s - m); acc (..., Bq, D) unnormalised output.
    Returns the new (m, l, acc). A row whose scores are all -inf so far keeps m = -inf, l = 0,
    acc = 0.
    """
    m_new = np.maximum(m, scores.max(axis=-1))                    # (..., Bq)
    alpha = np.exp(m - safe(m_new))                               # (..., Bq) rescales old state
    p = np.exp(scores - safe(m_new)[..., None])                   # (..., Bq, Bk)
    l_new = alpha * l + p.sum(axis=-1)
    acc_new = alpha[..., None] * acc + p @ v_block                # (..., Bq, D)
    return m_new, l_new, acc_new


def fa2_forward(q, k, v, *, block_q=64, block_k=64, causal=False, scale=None, tile_update=None):
    """FlashAttention-2 forward (Q blocks outer, KV blocks inner). Returns (out, lse).

    tile_update: the inner step, ``fa2_tile_update`` when None (exercise ex04 swaps in its own).
    """
    q, k, v = as_float_arrays(q, k, v)
    if tile_update is None:
        tile_update = fa2_tile_update
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = resolve_scale(scale, D)
    out = np.empty(q.shape, dtype=q.dtype)                        # (..., Nq, D)
    lse = np.empty(q.shape[:-1], dtype=q.dtype)                   # (..., Nq)
    for q_start in range(0, Nq, block_q):
        q_i = load_block(q, q_start, block_q)                     # (..., Bq, D)
        m = np.full(q_i.shape[:-1], -np.inf, dtype=q.dtype)       # (..., Bq) on chip
        l = np.zeros(q_i.shape[:-1], dtype=q.dtype)               # (..., Bq)
        acc = np.zeros(q_i.shape, dtype=q.dtype)                  # (..., Bq, D)
        for kb in kv_blocks(q_start, q_start + block_q, Nq, Nk, block_k, causal):
            k_start = kb * block_k
            mask = tile_mask(q_start, k_start, block_q, block_k, Nq, Nk, causal)
            s = masked_scores(q_i, load_block(k, k_start, block_k), scale, mask)
            m, l, acc = tile_update(s, load_block(v, k_start, block_k), m, l, acc)
        out_i, lse_i = finish(m, l, acc)
        store_block(out, q_start, out_i)
        store_block(lse, q_start, lse_i, axis=-1)
    return out, lse


def fa2_dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    """One (key block j, query block i) step of the backward's inner loop (FA2 Algorithm 2).

    q_i, o_i, do_i (..., Bq, D): queries, forward output and its gradient dO of the query block;
    k_j, v_j (..., Bk, D): the key/value block; lse_i (..., Bq): the forward's logsumexp (natural
    log; -inf for a row with nothing to attend to); mask (Bq, Bk) bool, True where query may see
    key; dk_j, dv_j (..., Bk, D): the block's running dK, dV. Returns the new (dk_j, dv_j) and
    ds (..., Bq, Bk) = dL/dS of the tile (S = scale Q K^T), which the caller adds into dQ.
    """
    s = masked_scores(q_i, k_j, scale, mask)                      # (..., Bq, Bk)
    p = np.exp(s - safe(lse_i)[..., None])                        # recomputed P; empty rows: 0
    delta_i = (do_i * o_i).sum(axis=-1)                           # (..., Bq) D = rowsum(dO * O)
    dv_j = dv_j + np.swapaxes(p, -1, -2) @ do_i                   # (..., Bk, D) dV += P^T dO
    dp = do_i @ np.swapaxes(v_j, -1, -2)                          # (..., Bq, Bk) dP = dO V^T
    ds = p * (dp - delta_i[..., None])                            # (..., Bq, Bk) softmax backward
    dk_j = dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i)         # (..., Bk, D) dK += scale dS^T Q
    return dk_j, dv_j, ds


def fa2_backward(q, k, v, out, lse, dout, *, block_q=64, block_k=64, causal=False, scale=None,
                 dkdv_update=None):
    """Tiled backward (FA2 Algorithm 2), recomputing P = exp(S - lse). Returns (dq, dk, dv).

    KV blocks outer: dK_j, dV_j stay "on chip" while the query blocks stream past; dQ lives in
    "HBM" and every tile adds its dS K_j to it. dkdv_update: the inner step, ``fa2_dkdv_update``
    when None (exercise ex08 swaps in its own).
    """
    q, k, v = as_float_arrays(q, k, v)
    if dkdv_update is None:
        dkdv_update = fa2_dkdv_update
    out, lse, dout = (np.asarray(t, dtype=q.dtype) for t in (out, lse, dout))
    if dout.shape != q.shape or out.shape != q.shape or lse.shape != q.shape[:-1]:
        raise ValueError(f"out and dout must have q's shape {q.shape} and lse {q.shape[:-1]}; "
                         f"got out {out.shape}, dout {dout.shape}, lse {lse.shape}")
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = resolve_scale(scale, D)
    dq = np.zeros(q.shape, dtype=q.dtype)                         # (..., Nq, D) in "HBM", / scale
    dk = np.empty(k.shape, dtype=q.dtype)
    dv = np.empty(v.shape, dtype=q.dtype)
    for k_start in range(0, Nk, block_k):
        k_j, v_j = load_block(k, k_start, block_k), load_block(v, k_start, block_k)
        dk_j = np.zeros(k_j.shape, dtype=q.dtype)                 # (..., Bk, D) on chip
        dv_j = np.zeros(v_j.shape, dtype=q.dtype)
        for q_start in range(0, Nq, block_q):
            if causal and k_start // block_k not in causal_block_range(
                    q_start, q_start + block_q, Nq, Nk, block_k):
                continue
            q_i, do_i = load_block(q, q_start, block_q), load_block(dout, q_start, block_q)
            o_i = load_block(out, q_start, block_q)               # (..., Bq, D)
            lse_i = load_block(lse, q_start, block_q, axis=-1, fill=-np.inf)    # (..., Bq)
            mask = tile_mask(q_start, k_start, block_q, block_k, Nq, Nk, causal)
            dk_j, dv_j, ds = dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j)
            store_block(dq, q_start, load_block(dq, q_start, block_q) + ds @ k_j)
        store_block(dk, k_start, dk_j)
        store_block(dv, k_start, dv_j)
    return scale * dq, dk, dv
