"""Exercise 10 (lesson 10): merge Flash-Decoding's partial results by their lse.

Flash-Decoding cuts the keys of each query row into S splits and attends to every split in
parallel. Split s returns its output out_s, normalised over its own keys (a softmax-weighted mean
of its values), and its log-sum-exp lse_s = log(sum over its keys j of exp(score_j)), natural log.
Full attention over all the keys is recovered exactly by lesson 03's merge:

    lse = log(sum_s exp(lse_s))                  # the log-sum-exp of every score
    out = sum_s exp(lse_s - lse) * out_s         # the weights exp(lse_s - lse) sum to 1

Compute it safely:
- subtract the largest lse_s before exponentiating: scores, and so the lse_s, can be in the
  thousands, far past exp's range (88.7 in float32);
- an empty split (no key to attend to, e.g. past a short sequence's end) has lse_s = -inf and
  out_s = 0: its weight must be exactly 0;
- a row whose every split is empty has nothing to attend to: out = 0 and lse = -inf, never NaN
  (exp(-inf - (-inf)) is NaN: use 0 as the reference max when the max is -inf).

This is the job of flashlib's combine kernel (``_combine_kernel`` in flashlib/kernels/decode.py);
write it in NumPy, then run ``flashlib check ex10``.
"""
import numpy as np


def combine_splits(out_parts, lse_parts):
    """Merge the S partial attention results of every query row.

    out_parts: (..., S, D), each split's normalised output; lse_parts: (..., S), each split's
    natural-log lse, -inf for an empty split (whose out_parts row is 0). float32 or float64
    NumPy arrays (one dtype); any leading dims (e.g. batch, heads, new tokens).
    Returns (out, lse): out (..., D) and lse (...), in the inputs' dtype.
    """
    # BEGIN SOLUTION
    m = lse_parts.max(axis=-1, keepdims=True)                 # (..., 1) the largest lse_s
    m = np.where(np.isneginf(m), 0.0, m)                      # every split empty: any finite m
    w = np.exp(lse_parts - m)                                 # (..., S), <= 1, 0 where empty
    total = w.sum(axis=-1)                                    # (...) sum_s exp(lse_s - m)
    empty = total == 0.0
    out = (w[..., None] * out_parts).sum(axis=-2) / np.where(empty, 1.0, total)[..., None]
    lse = np.where(empty, -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, total)))
    # END SOLUTION
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
