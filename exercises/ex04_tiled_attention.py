"""Exercise 04 (lesson 04): the inner step of FlashAttention-2's tile loop.

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

After the last block the caller divides once, out = acc / l, and stores lse = m + log(l).
Masked scores are -inf (causal masking, padding past N). A row can have only -inf scores so far
(a causal row with no key yet, a padded row): then m_new = -inf and exp(-inf - (-inf)) is NaN.
Such a row must keep m = -inf, l = 0, acc = 0: use 0 instead of -inf as its reference max.

``flashlib.teach.tiled.fa2_forward(q, k, v, block_q=..., block_k=..., causal=..., tile_update=fn)``
runs the loops around your step (look at it); ``flashlib.teach.tiled.fa2_tile_update`` is the
library's answer. Write the step below; then run ``flashlib check ex04``.

RETURN ORDER: ``return m_new, l, acc``, the state in the order it comes in (m, l, acc). Exercise
07's Triton step keeps its state in another order, (acc, m_i, l_i), the order of flashlib's
kernels, and returns it in that order: mind the difference when you get there.
"""
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
