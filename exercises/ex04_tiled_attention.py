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
    raise NotImplementedError('ex04: your code goes here, then run `flashlib check ex04`')


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
    raise NotImplementedError('ex04: your code goes here, then run `flashlib check ex04`')
