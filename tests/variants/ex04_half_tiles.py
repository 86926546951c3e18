"""Correct variant of ex04 with other tile sizes: fa2_forward computes tiles of half a block
(ceil(block_q / 2) x ceil(block_k / 2)), skipping at that finer grain, and scales q instead of
the scores."""
import numpy as np


def fa2_tile_update(scores, v_block, m, l, acc):
    m_new = np.maximum(m, np.max(scores, axis=-1))
    ref = np.where(m_new == -np.inf, np.zeros_like(m_new), m_new)
    alpha = np.exp(m - ref)
    p = np.exp(scores - ref[..., :, None])
    return m_new, l * alpha + np.sum(p, axis=-1), acc * alpha[..., None] + p @ v_block


def fa2_forward(q, k, v, *, block_q=64, block_k=64, causal=False, scale=None):
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    if scale is None:
        scale = 1 / np.sqrt(D)
    bq, bk = -(-block_q // 2), -(-block_k // 2)
    out = np.zeros_like(q)
    lse = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)
    shift = Nk - Nq if causal else Nk                  # causal: key j visible iff j <= i + shift
    for q0 in range(0, Nq, bq):
        q_i = q[..., q0:q0 + bq, :] * q.dtype.type(scale)
        i = np.arange(q0, q0 + q_i.shape[-2])
        m = np.full(q_i.shape[:-1], -np.inf, dtype=q.dtype)
        l = np.zeros_like(m)
        acc = np.zeros_like(q_i)
        for k0 in range(0, min(Nk, i[-1] + shift + 1), bk):
            k_j = k[..., k0:k0 + bk, :]
            j = np.arange(k0, k0 + k_j.shape[-2])
            s = q_i @ k_j.swapaxes(-1, -2)
            if causal:
                s[..., j[None, :] > i[:, None] + shift] = -np.inf
            m, l, acc = fa2_tile_update(s, v[..., k0:k0 + bk, :], m, l, acc)
        rows = l > 0
        out[..., q0:q0 + bq, :] = np.divide(acc, l[..., None], out=np.zeros_like(acc),
                                            where=rows[..., None])
        lse[..., q0:q0 + bq] = np.log(l, out=np.full_like(l, -np.inf), where=rows) + \
            np.where(rows, m, 0)
    return out, lse
