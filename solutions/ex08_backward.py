"""Exercise 08 (lesson 08): the inner step of the FlashAttention backward, for one tile.

The forward saved only q, k, v, the output O and one number per query row, lse = log of the
row's softmax denominator (natural log). The backward (FlashAttention-2, Dao 2023, Algorithm 2)
never stores the (Nq, Nk) matrix P: it walks over key/value blocks j (outer loop, dK_j and dV_j
stay on chip) and, for each, over the query blocks i, and RECOMPUTES the tile of P from the
scores and lse. With S = scale * Q K^T and dO the gradient of the output, for one tile:

    S   = scale * Q_i K_j^T, -inf where the mask is False     # (Bq, Bk)
    P   = exp(S - lse_i[:, None])                            # exactly softmax's P: no max, no sum
    D_i = rowsum(dO_i * O_i)                                 # (Bq,) equals rowsum(P * dP) over
                                                             #       ALL keys of the row
    dV_j += P^T dO_i                                         # (Bk, D)
    dP  = dO_i V_j^T                                         # (Bq, Bk)
    dS  = P * (dP - D_i[:, None])                            # softmax's backward, per element
    dK_j += scale * dS^T Q_i                                 # (Bk, D)

and the caller adds dS K_j into dQ_i (and multiplies dQ by scale once at the end). Why D from O:
softmax's backward needs rowsum(P * dP) over the whole row, but a tile sees only Bk of its keys;
rowsum(P * dP) = rowsum(P * (dO V^T)) = rowsum(dO * (P V)) = rowsum(dO * O), which any tile can
compute from its own rows.

Masked entries (causal, keys past Nk) have S = -inf, so P = 0 there. A row with nothing to
attend to (causal with Nq > Nk, a padded row) has lse = -inf, and exp(-inf - (-inf)) is NaN:
such a row must get P = 0 (use 0 instead of -inf as its lse).

``flashlib.teach.tiled.fa2_backward(q, k, v, out, lse, dout, ..., dkdv_update=fn)`` runs the loops
around your step (look at it); ``flashlib.teach.tiled.fa2_dkdv_update`` is the library's answer.
Write the step below; then run ``flashlib check ex08``.
"""
import numpy as np


def dkdv_update(q_i, k_j, v_j, o_i, do_i, lse_i, mask, scale, dk_j, dv_j):
    """One (key block j, query block i) step of the backward. Returns (dk_j, dv_j, ds).

    q_i, o_i, do_i: (..., Bq, D) the query block's queries, forward output O and its gradient dO.
    k_j, v_j: (..., Bk, D) the key and value block.
    lse_i: (..., Bq) the forward's logsumexp per query row, natural log; -inf for a row with
    nothing to attend to.
    mask: (Bq, Bk) bool, True where query row r may attend key c of this tile (causal rule,
    padding past Nq / Nk); it broadcasts over the leading dims.
    scale: the softmax scale (S = scale * Q K^T).
    dk_j, dv_j: (..., Bk, D) this key block's dK and dV accumulated over earlier query blocks.
    Returns the new dk_j, dv_j (same shapes: dV += P^T dO, dK += scale * dS^T Q) and ds
    (..., Bq, Bk) = P * (dP - D), the gradient with respect to S of this tile. No NaN: a row
    with lse = -inf contributes nothing. Do not modify the arguments in place.
    """
    # BEGIN SOLUTION
    s = scale * (q_i @ np.swapaxes(k_j, -1, -2))                # (..., Bq, Bk)
    s = np.where(mask, s, -np.inf)                              # masked keys: P = 0
    lse_safe = np.where(np.isneginf(lse_i), 0.0, lse_i)         # empty rows: exp(-inf - 0) = 0
    p = np.exp(s - lse_safe[..., None])                         # (..., Bq, Bk) recomputed P
    delta = (do_i * o_i).sum(axis=-1)                           # (..., Bq) D = rowsum(dO * O)
    dv_j = dv_j + np.swapaxes(p, -1, -2) @ do_i                 # (..., Bk, D)
    dp = do_i @ np.swapaxes(v_j, -1, -2)                        # (..., Bq, Bk)
    ds = p * (dp - delta[..., None])                            # (..., Bq, Bk)
    dk_j = dk_j + scale * (np.swapaxes(ds, -1, -2) @ q_i)       # (..., Bk, D)
    return dk_j, dv_j, ds
    # END SOLUTION
