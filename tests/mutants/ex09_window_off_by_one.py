"""Mutant of ex09: the window lets each query see window + 1 keys (>= instead of >)."""
import numpy as np

EXPECTED_HINT = 'off by one'

EMPTY, PARTIAL, FULL = 0, 1, 2


def sliding_window_allowed(n_q, n_k, window):
    p = np.arange(n_q)[:, None] + (n_k - n_q)                  # (n_q, 1) query positions
    j = np.arange(n_k)[None, :]                                # (1, n_k) key positions
    return (j <= p) & (j >= p - window)                         # (n_q, n_k)


def classify_blocks(allowed, block_size):
    allowed = np.asarray(allowed, dtype=bool)
    n_q, n_k = allowed.shape
    bs = block_size
    nQ, nK = -(-n_q // bs), -(-n_k // bs)
    padded = np.zeros((nQ * bs, nK * bs), dtype=bool)          # padding: not allowed
    padded[:n_q, :n_k] = allowed
    seen = padded.reshape(nQ, bs, nK, bs).sum(axis=(1, 3))     # (nQ, nK) allowed pairs per tile
    rows = np.minimum(bs, n_q - bs * np.arange(nQ))            # (nQ,) real query rows per block
    full = seen == (rows * bs)[:, None]                        # every real row sees all bs keys
    return np.where(seen == 0, EMPTY, np.where(full, FULL, PARTIAL))


def visit_lists(kinds):
    kinds = np.asarray(kinds)

    def lists(rows):                                           # one list per row of ``rows``
        return [np.concatenate([np.flatnonzero(row == FULL), np.flatnonzero(row == PARTIAL)])
                for row in rows]
    return lists(kinds), lists(kinds.T)
