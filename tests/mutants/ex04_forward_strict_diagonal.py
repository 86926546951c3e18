"""Mutant of ex04: fa2_forward's causal mask is strict (j < i + Nk - Nq): the diagonal key is left
out of every row."""
import math

import numpy as np

EXPECTED_HINT = 'leaves out the diagonal'


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
    m_new = np.maximum(m, scores.max(axis=-1))                  # (..., Bq)
    # a row with only -inf so far: take 0 as its reference so exp(-inf - 0) = 0, not NaN
    m_ref = np.where(np.isneginf(m_new), 0.0, m_new)            # (..., Bq)
    alpha = np.exp(m - m_ref)                                   # (..., Bq) 0 on the first block
    p = np.exp(scores - m_ref[..., None])                       # (..., Bq, Bk)
    l = alpha * l + p.sum(axis=-1)                              # (..., Bq)
    acc = alpha[..., None] * acc + p @ v_block                  # (..., Bq, D)
    return m_new, l, acc


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
                s = np.where(cols < rows[:, None] + (Nk - Nq), s, -np.inf)
            m, l, acc = fa2_tile_update(s, v_j, m, l, acc)
        seen = l > 0                                                # (..., bq) rows with a key
        out[..., q0:q0 + block_q, :] = acc / np.where(seen, l, 1)[..., None]
        lse[..., q0:q0 + block_q] = np.where(seen, m + np.log(np.where(seen, l, 1)), -np.inf)
    return out, lse
