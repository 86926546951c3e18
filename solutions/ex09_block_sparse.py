"""Exercise 09 (lesson 09): from a masking rule to the block lists a block-sparse kernel walks.

Block-sparse FlashAttention (Dao et al. 2022, section 3.3) runs the FlashAttention loops over
only the non-empty tiles of the score matrix. Before any kernel runs, a rule ("query i may
attend key j") is turned into tables, in three steps, which you write here in NumPy:

1. ``sliding_window_allowed``: the rule itself, as a bool matrix. Causal sliding window,
   bottom-right aligned like every mask in this course: query i sits at position
   p = i + n_k - n_q and sees the ``window`` keys p - window < j <= p (itself included).

2. ``classify_blocks``: cut the (n_q, n_k) matrix into block_size x block_size tiles,
   nQ = ceil(n_q / block_size) by nK = ceil(n_k / block_size) of them (the last row and column
   of tiles may be shorter), and give each tile a kind:

       EMPTY (0)    no allowed pair: a kernel never loads it;
       FULL (2)     every pair allowed: a kernel computes it with no mask at all;
       PARTIAL (1)  anything else: a kernel computes it and masks element-wise.

   Count as the kernel sees a tile: keys j >= n_k (past the end of the last key tile) are NOT
   allowed, since a kernel that skipped the mask would read padding as if it were keys, so such
   a tile is never FULL; query rows i >= n_q do not count at all (the kernel neither reads nor
   writes them), so a tile whose real rows all see all its keys is FULL.

3. ``visit_lists``: from the kinds, what each program of the kernel walks.
   ``kv_lists[i]``: for query block i (forward and dQ kernels), the key blocks to visit: the
   FULL ones first, then the PARTIAL ones, each group in ascending order, no EMPTY one. The
   kernel walks the full ones with its unmasked loop and the rest with its masked loop.
   ``q_lists[j]``: for key block j (the dK/dV kernel of the backward, one program per key
   block), the query blocks that see it, by the same rule: the transpose.

These are exactly the conventions of ``flashlib.masks.BlockMask`` (its ``kinds``, and
``kv_index[..., :kv_count]`` / ``q_index[..., :q_count]``); the grader compares with them, then
runs a small NumPy block-sparse attention forward and backward on your lists and compares with
``attention_ref`` under the dense mask. Use NumPy only (no flashlib); then run
``flashlib check ex09``.
"""
import numpy as np

EMPTY, PARTIAL, FULL = 0, 1, 2


def sliding_window_allowed(n_q, n_k, window):
    """(n_q, n_k) bool: True where query i may attend key j under the causal sliding window.

    Bottom-right aligned: with p = i + n_k - n_q, query i sees keys p - window < j <= p
    (``window`` keys ending at its own position; fewer near the start, none if p < 0).
    """
    # BEGIN SOLUTION
    p = np.arange(n_q)[:, None] + (n_k - n_q)                  # (n_q, 1) query positions
    j = np.arange(n_k)[None, :]                                # (1, n_k) key positions
    return (j <= p) & (j > p - window)                         # (n_q, n_k)
    # END SOLUTION


def classify_blocks(allowed, block_size):
    """(nQ, nK) int array of tile kinds (EMPTY 0, PARTIAL 1, FULL 2) of the bool matrix
    ``allowed`` (n_q, n_k), cut into block_size x block_size tiles; nQ = ceil(n_q / block_size),
    nK = ceil(n_k / block_size). Keys past n_k count as not allowed (a tile running past n_k is
    never FULL); query rows past n_q do not count.
    """
    # BEGIN SOLUTION
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
    # END SOLUTION


def visit_lists(kinds):
    """(kv_lists, q_lists) from the (nQ, nK) tile kinds.

    kv_lists: nQ 1-D int arrays, kv_lists[i] = the key blocks query block i visits;
    q_lists: nK 1-D int arrays, q_lists[j] = the query blocks that visit key block j.
    Each: FULL blocks first, then PARTIAL ones, ascending within each group; EMPTY left out.
    """
    # BEGIN SOLUTION
    kinds = np.asarray(kinds)

    def lists(rows):                                           # one list per row of ``rows``
        return [np.concatenate([np.flatnonzero(row == FULL), np.flatnonzero(row == PARTIAL)])
                for row in rows]
    return lists(kinds), lists(kinds.T)
    # END SOLUTION
