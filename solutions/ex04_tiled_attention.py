"""Exercise 04 (lesson 04): FlashAttention-2's forward in NumPy, its inner step and its loops.

FlashAttention-2 (Dao 2023, Algorithm 1) gives each block of Bq query rows to one program. It
keeps that block's running state on chip: m (Bq,) the running max of the scores, l (Bq,) the
running sum of exp(s - m), and acc (Bq, D) the UNNORMALISED output, and walks over the key/value
blocks. For each block it gets the (already scaled, already masked) scores S (Bq, Bk) and the
values V_j (Bk, D), and updates:

    m_new = max(m, rowmax(S))
    alpha = exp(m - m_new)                      # rescales the old state
    P     = exp(S - m_new[:, None])             # (Bq, Bk)
    l     = alpha * l + rowsum(P)
    acc   = alpha[:, None] * acc + P @ V_j      # no division here: normalisation is deferred

After the last block the program divides once, out = acc / l, and stores lse = m + log(l).
Masked scores are -inf (causal masking, padding past N). A row can have only -inf scores so far
(a causal row with no key yet, a padded row): then m_new = -inf and exp(-inf - (-inf)) is NaN.
Such a row must keep m = -inf, l = 0, acc = 0: use 0 instead of -inf as its reference max.

You write two functions:

- ``fa2_tile_update``: the inner step above. ``flashlib.teach.tiled.fa2_forward(q, k, v,
  block_q=..., block_k=..., causal=..., tile_update=fn)`` runs flashlib's loops around it;
- ``fa2_forward``: the whole forward around your step, the loops of lesson 04's table: query
  blocks outer, key blocks inner, the scores of each tile scaled and masked, and the finish.

Causal attention here is bottom-right aligned, as in flash-attn: query i sees key j iff
j <= i + Nk - Nq. A tile whose every key lies past what its query rows may see is never
computed: FlashAttention-2 stops a query block's key loop at the block holding the last key
that its last row sees (about half of all tiles are skipped when Nq = Nk). With Nq > Nk the
first Nq - Nk rows see no key at all: their out is 0 and their lse -inf.

``flashlib.teach.tiled`` has the library's ``fa2_tile_update`` and ``fa2_forward`` (look at
them after you are done). Then run ``flashlib check ex04``.

RETURN ORDER: ``return m_new, l, acc``, the state in the order it comes in (m, l, acc). Exercise
07's Triton step keeps its state in another order, (acc, m_i, l_i), the order of flashlib's
kernels, and returns it in that order: mind the difference when you get there.
"""
import math

import numpy as np


def fa2_tile_update(scores, v_block, m, l, acc):
    """One FA2 inner-loop step for a block of query rows. Returns the new (m, l, acc).

    scores: (..., Bq, Bk) scaled scores, -inf where masked.
    v_block: (..., Bk, D) the values of this key block.
    m: (..., Bq) running max (-inf before the first key); l: (..., Bq) running sum of
    exp(s - m) (0 at first); acc: (..., Bq, D) running unnormalised output (0 at first).
    Returns (m, l, acc), in this order (not ex07's (acc, m, l)), with the same shapes and
    dtype, including this block. No division by l, and no NaN: a row whose scores have all
    been -inf keeps m = -inf, l = 0, acc = 0.
    Do not modify the arguments in place.
    """
    # BEGIN SOLUTION
    m_new = np.maximum(m, scores.max(axis=-1))                  # (..., Bq)
    # a row with only -inf so far: take 0 as its reference so exp(-inf - 0) = 0, not NaN
    m_ref = np.where(np.isneginf(m_new), 0.0, m_new)            # (..., Bq)
    alpha = np.exp(m - m_ref)                                   # (..., Bq) 0 on the first block
    p = np.exp(scores - m_ref[..., None])                       # (..., Bq, Bk)
    l = alpha * l + p.sum(axis=-1)                              # (..., Bq)
    acc = alpha[..., None] * acc + p @ v_block                  # (..., Bq, D)
    return m_new, l, acc
    # END SOLUTION


def fa2_forward(q, k, v, *, block_q=64, block_k=64, causal=False, scale=None):
    """FlashAttention-2's forward: query blocks outer, key blocks inner. Returns (out, lse).

    q: (..., Nq, D); k, v: (..., Nk, D) with q's leading dims; float32 or float64 (one dtype);
    Nq, Nk >= 1, any sizes. block_q, block_k: ints >= 1, the tile (need not divide Nq, Nk).
    causal: bottom-right aligned (query i sees key j iff j <= i + Nk - Nq). scale: multiplies
    q . k; 1/sqrt(D) when None.
    Returns out (..., Nq, D) = softmax(scale * q @ k^T, masked) @ v, and lse (..., Nq), the
    natural-log log-sum-exp of each row's (masked) scores, both in q's dtype; a row that sees no
    key gets out = 0 and lse = -inf, no NaN.
    Reads q, k and v only a tile at a time (q[..., i:i + block_q, :], k[..., j:j + block_k, :],
    at most block_q or block_k rows, every leading index at once), and with causal=True never
    reads a key tile that lies wholly past what the query block's rows see.
    """
    # BEGIN SOLUTION
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros(q.shape, dtype=q.dtype)                          # (..., Nq, D)
    lse = np.zeros(q.shape[:-1], dtype=q.dtype)                     # (..., Nq)
    for q0 in range(0, Nq, block_q):
        q_i = q[..., q0:q0 + block_q, :]                            # (..., bq, D), bq <= block_q
        rows = np.arange(q0, q0 + q_i.shape[-2])                    # (bq,) query positions
        m = np.full(q_i.shape[:-1], -np.inf, dtype=q.dtype)         # (..., bq) on chip
        l = np.zeros(q_i.shape[:-1], dtype=q.dtype)                 # (..., bq)
        acc = np.zeros(q_i.shape, dtype=q.dtype)                    # (..., bq, D)
        # causal: no row of this block sees a key past its last row's i + Nk - Nq
        k_end = min(Nk, rows[-1] + Nk - Nq + 1) if causal else Nk
        for k0 in range(0, k_end, block_k):                         # tiles past k_end: skipped
            k_j, v_j = k[..., k0:k0 + block_k, :], v[..., k0:k0 + block_k, :]   # (..., bk, D)
            s = (q_i @ np.swapaxes(k_j, -1, -2)) * scale            # (..., bq, bk)
            if causal:
                cols = np.arange(k0, k0 + k_j.shape[-2])            # (bk,) key positions
                s = np.where(cols <= rows[:, None] + (Nk - Nq), s, -np.inf)
            m, l, acc = fa2_tile_update(s, v_j, m, l, acc)
        seen = l > 0                                                # (..., bq) rows with a key
        out[..., q0:q0 + block_q, :] = acc / np.where(seen, l, 1)[..., None]
        lse[..., q0:q0 + block_q] = np.where(seen, m + np.log(np.where(seen, l, 1)), -np.inf)
    return out, lse
    # END SOLUTION
