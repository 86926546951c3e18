"""Correct variant of ex04: base-2 exponents with log2(e) folded in, einsum for P V; fa2_forward
walks its tiles in another order, padded to full size as a kernel loads them."""
import numpy as np

LOG2E = 1.4426950408889634


def fa2_tile_update(scores, v_block, m, l, acc):
    c = scores.dtype.type(LOG2E)
    m_new = np.maximum(m, scores.max(axis=-1))                   # (..., Bq)
    m_ref = np.where(np.isneginf(m_new), 0, m_new).astype(m.dtype)
    alpha = np.exp2((m - m_ref) * c)                             # (..., Bq)
    p = np.exp2((scores - m_ref[..., None]) * c)                 # (..., Bq, Bk)
    return (m_new, l * alpha + p.sum(axis=-1),
            acc * alpha[..., None] + np.einsum("...qk,...kd->...qd", p, v_block))


def fa2_forward(q, k, v, *, block_q=64, block_k=64, causal=False, scale=None):
    """Another loop order: query blocks from the last to the first, and each one's key blocks from
    the diagonal back to the first; tiles padded to full size (masked loads) and masked as a
    kernel does, padded keys with -inf."""
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = q.dtype.type(D ** -0.5 if scale is None else scale)
    out, lse = np.empty_like(q), np.empty(q.shape[:-1], dtype=q.dtype)
    n_q = -(-Nq // block_q)
    for qb in reversed(range(n_q)):
        q0 = qb * block_q
        q_i = _padded(q[..., q0:q0 + block_q, :], block_q)          # (..., block_q, D)
        i = q0 + np.arange(block_q)[:, None]                          # (block_q, 1)
        m = np.full(q_i.shape[:-1], -np.inf, dtype=q.dtype)
        l = np.zeros(q_i.shape[:-1], dtype=q.dtype)
        acc = np.zeros(q_i.shape, dtype=q.dtype)
        last = min(Nq, q0 + block_q) - 1 + Nk - Nq if causal else Nk - 1
        for kb in reversed(range(min(-(-Nk // block_k), last // block_k + 1) if last >= 0 else 0)):
            k0 = kb * block_k
            k_j = _padded(k[..., k0:k0 + block_k, :], block_k)
            v_j = _padded(v[..., k0:k0 + block_k, :], block_k)
            j = k0 + np.arange(block_k)[None, :]                     # (1, block_k)
            ok = (j < Nk) & ((j <= i + Nk - Nq) if causal else True)
            s = np.where(ok, np.einsum("...qd,...kd->...qk", q_i, k_j) * scale, -np.inf)
            m, l, acc = fa2_tile_update(s, v_j, m, l, acc)
        n = min(block_q, Nq - q0)
        has = l[..., :n] > 0
        out[..., q0:q0 + n, :] = np.where(has[..., None], acc[..., :n, :], 0) / \
            np.where(has, l[..., :n], 1)[..., None]
        lse[..., q0:q0 + n] = np.where(has, m[..., :n] + np.log(np.where(has, l[..., :n], 1)),
                                       -np.inf)
    return out, lse


def _padded(tile, size):
    """A tile of ``size`` rows: the rows past the end are zeros (a masked load)."""
    missing = size - tile.shape[-2]
    if missing == 0:
        return tile
    return np.concatenate([tile, np.zeros(tile.shape[:-2] + (missing, tile.shape[-1]),
                                          dtype=tile.dtype)], axis=-2)
