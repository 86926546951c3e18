"""Mutant of ex03: merge_states merges one row at a time (Python floats) and stacks the rows:
right for every batch with rows, an error for a batch with none (np.stack of nothing)."""
import math

import numpy as np

EXPECTED_HINT = 'a batch may hold no rows'


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
    for j in range(Nk):
        s = (q @ k[j]) * scale                        # (Nq,) every row's score with key j
        m_new = np.maximum(m, s)
        alpha = np.exp(m - m_new)                     # (Nq,) 0 for the first key, else <= 1
        p = np.exp(s - m_new)                         # (Nq,) weight of key j, <= 1
        l = l * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v[j]   # (Nq, D)
        m = m_new
    out = acc / l[:, None]                            # normalise once, at the end
    lse = m + np.log(l)
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
    D, dtype = out_a.shape[-1], out_a.dtype
    rows_a, rows_b = out_a.reshape(-1, D), out_b.reshape(-1, D)
    outs, lses = [], []
    for oa, la, ob, lb in zip(rows_a, lse_a.reshape(-1), rows_b, lse_b.reshape(-1)):
        m = max(float(la), float(lb))
        if m == -math.inf:                                    # both empty
            outs.append(np.zeros(D, dtype))
            lses.append(-math.inf)
            continue
        wa, wb = math.exp(float(la) - m), math.exp(float(lb) - m)
        outs.append(((wa * oa + wb * ob) / (wa + wb)).astype(dtype))
        lses.append(m + math.log(wa + wb))
    out = np.stack(outs).reshape(out_a.shape)
    lse = np.array(lses, dtype=dtype).reshape(lse_a.shape)
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
    out = np.zeros(q.shape, dtype=q.dtype)                   # (Nq, D) nothing seen: empty
    lse = np.full(q.shape[:1], -np.inf, dtype=q.dtype)        # (Nq,)
    for start, stop in zip(cuts[:-1], cuts[1:]):
        if stop > start:                                      # an empty part adds nothing
            part = online_attention(q, k[start:stop], v[start:stop], scale=scale)
            out, lse = merge_states(out, lse, *part)
    return out, lse
