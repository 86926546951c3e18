"""Exercise 03 (lesson 03): attention in one pass over the keys, and partial results merged.

Attention for one query row q: scores s_j = scale * (q . k_j), weights p_j = softmax(s)_j,
output o = sum_j p_j v_j. The online normaliser of lesson 02 extends to the output: keep per
query row the running max m, the running sum l = sum_j exp(s_j - m) and the UNNORMALISED output
acc = sum_j exp(s_j - m) v_j over the keys seen so far. For each new key j:

    m_new = max(m, s_j)
    alpha = exp(m - m_new)                     # rescales everything computed relative to m
    l     = l * alpha + exp(s_j - m_new)
    acc   = acc * alpha + exp(s_j - m_new) * v_j
    m     = m_new

and only after the last key: out = acc / l (normalise once), and the log-sum-exp of the scores
lse = m + log(l) (FlashAttention-2 saves it for the backward pass).

The pair (out, lse) summarises the keys it was computed over: two such partial results over
disjoint sets of keys determine the result over their union, without the keys (lesson 03,
section 3). That merge is how Flash-Decoding combines the parts of a split KV cache (lesson 10)
and ring attention the blocks that travel around GPUs (lesson 14). A part may be empty (a split
with no valid key, a row that may see none of a block): its lse is -inf and its out 0.

You write three functions: ``online_attention`` (the loop, vectorised over the query rows),
``merge_states`` (two partial results into one), and ``split_attention`` (attention over keys
cut into parts: each part on its own with online_attention, the parts merged). Compare
``flashlib.teach.tiled``'s ``online_attention`` and ``merge_states``; then run
``flashlib check ex03``.
"""
import math

import numpy as np


def online_attention(q, k, v, *, scale=None):
    """Softmax attention of every query row over all keys, in one pass over the keys.

    q: (Nq, D); k, v: (Nk, D), Nk >= 1; float32 or float64 NumPy arrays (one dtype).
    scale: multiplies the scores q . k_j; 1/sqrt(D) when None.
    Returns (out, lse): out (Nq, D) = softmax(scale * q @ k.T) @ v, and lse (Nq,) = the
    natural-log log-sum-exp of each row of scale * q @ k.T; both in q's dtype.
    """
    Nq, D = q.shape
    Nk = k.shape[0]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m = np.full(Nq, -np.inf, dtype=q.dtype)     # (Nq,) running max of the scores
    l = np.zeros(Nq, dtype=q.dtype)             # (Nq,) running sum of exp(s - m)
    acc = np.zeros((Nq, D), dtype=q.dtype)      # (Nq, D) running unnormalised output
    raise NotImplementedError('ex03: your code goes here, then run `flashlib check ex03`')
    return out, lse


def merge_states(out_a, lse_a, out_b, lse_b):
    """The attention result over the keys of two parts, from each part's own result.

    out_a, out_b: (..., D), each the attention output over its part's keys alone (normalised
    over them); lse_a, lse_b: (...), each the natural-log log-sum-exp of its part's scores, -inf
    for a part with no key (whose out is then 0). The lse values may be far from 0 (thousands,
    either sign, or further). One float dtype throughout.
    Returns (out (..., D), lse (...)): the output and the log-sum-exp over the keys of both
    parts, in the inputs' dtype. A part with lse = -inf leaves the other unchanged; a row empty
    in both parts gets out = 0 and lse = -inf, never NaN. Does not modify its arguments.
    Weigh the parts relative to the larger lse, or in log space (the merged lse first, then each
    part's weight e^(lse_part - lse), as Flash-Decoding's combine and ring attention do): either
    is right, within the rounding of lse that the log-space form carries.
    """
    raise NotImplementedError('ex03: your code goes here, then run `flashlib check ex03`')
    return out, lse


def split_attention(q, k, v, cuts, *, scale=None):
    """Attention over all keys, computed a part at a time: part i holds keys cuts[i]:cuts[i + 1].

    q: (Nq, D); k, v: (Nk, D), Nk >= 0; cuts: non-decreasing ints from cuts[0] = 0 to
    cuts[-1] = Nk (a part may be empty). scale: as online_attention's.
    Each non-empty part is attended on its own (your online_attention, on that part's keys
    only) and the parts' results are merged (your merge_states).
    Returns (out (Nq, D), lse (Nq,)) as online_attention does, in q's dtype; with no key at
    all (Nk = 0), out = 0 and lse = -inf.
    """
    raise NotImplementedError('ex03: your code goes here, then run `flashlib check ex03`')
    return out, lse
