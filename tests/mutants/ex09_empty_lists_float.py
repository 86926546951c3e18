"""Mutant of ex09: visit lists built with np.array(list): an empty one (a block that visits nothing)
is float64 np.array([]), not an int array."""
import numpy as np

EXPECTED_HINT = "an empty list too must be an int array"

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
    """(nQ, nK) int array of tile kinds (EMPTY 0, PARTIAL 1, FULL 2) of the bool matrix
    ``allowed`` (n_q, n_k), cut into block_size x block_size tiles; nQ = ceil(n_q / block_size),
    nK = ceil(n_k / block_size). Keys past n_k count as not allowed (a tile running past n_k is
    never FULL); query rows past n_q do not count.
    """
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
    """(kv_lists, q_lists) from the (nQ, nK) tile kinds.

    kv_lists: nQ 1-D int arrays, kv_lists[i] = the key blocks query block i visits;
    q_lists: nK 1-D int arrays, q_lists[j] = the query blocks that visit key block j.
    Each: FULL blocks first, then PARTIAL ones, ascending within each group; EMPTY left out.
    """
    kinds = np.asarray(kinds)

    def lists(rows):                                           # one list per row of ``rows``
        return [np.array([j for j in range(len(row)) if row[j] == FULL]
                         + [j for j in range(len(row)) if row[j] == PARTIAL]) for row in rows]
    return lists(kinds), lists(kinds.T)
