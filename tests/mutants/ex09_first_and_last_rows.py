"""Mutant of ex09: classify_blocks calls a tile FULL when its first and last rows see all its keys
(enough for a band: causal, sliding windows, packed documents), without looking at the rows in
between: wrong for local + global masks, where a global token's row sees every key and the rows
after it only their window."""
import numpy as np

EXPECTED_HINT = "middle rows"

EMPTY, PARTIAL, FULL = 0, 1, 2


def sliding_window_allowed(n_q, n_k, window):
    """(n_q, n_k) bool: True where query i may attend key j under the causal sliding window.

    Bottom-right aligned: with p = i + n_k - n_q, query i sees keys p - window < j <= p
    (``window`` keys ending at its own position; fewer near the start, none if p < 0).
    """
    p = np.arange(n_q)[:, None] + (n_k - n_q)                  # (n_q, 1) query positions
    j = np.arange(n_k)[None, :]                                # (1, n_k) key positions
    return (j <= p) & (j > p - window)                         # (n_q, n_k)


def classify_blocks(allowed, block_size):
    allowed = np.asarray(allowed, dtype=bool)
    n_q, n_k = allowed.shape
    bs = block_size
    nQ, nK = -(-n_q // bs), -(-n_k // bs)
    padded = np.zeros((n_q, nK * bs), dtype=bool)              # padding: not allowed
    padded[:, :n_k] = allowed
    kinds = np.empty((nQ, nK), dtype=np.int64)
    for i in range(nQ):
        rows = padded[i * bs:(i + 1) * bs].reshape(-1, nK, bs)   # (real rows, nK, bs)
        seen = rows.any(axis=(0, 2))                             # (nK,) some pair allowed
        full = rows[[0, -1]].all(axis=(0, 2))                    # first and last rows see all
        kinds[i] = np.where(full, FULL, np.where(seen, PARTIAL, EMPTY))
    return kinds


def visit_lists(kinds):
    """(kv_lists, q_lists) from the (nQ, nK) tile kinds.

    kv_lists: nQ 1-D int arrays, kv_lists[i] = the key blocks query block i visits;
    q_lists: nK 1-D int arrays, q_lists[j] = the query blocks that visit key block j.
    Each: FULL blocks first, then PARTIAL ones, ascending within each group; EMPTY left out.
    """
    kinds = np.asarray(kinds)

    def lists(rows):                                           # one list per row of ``rows``
        return [np.concatenate([np.flatnonzero(row == FULL), np.flatnonzero(row == PARTIAL)])
                for row in rows]
    return lists(kinds), lists(kinds.T)
