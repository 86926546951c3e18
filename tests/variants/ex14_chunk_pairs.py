"""Correct variant of ex14: ring_step over (query chunk, key chunk) pairs by their global chunk
numbers (one chunk per shard when contiguous, two when zigzag), each pair skipped, causal or
full, merged one at a time; zigzag_shard by reshaping into 2W chunks."""
import math

import torch


def merge(out, lse, out_blk, lse_blk):
    """Fold one block's attention result into the running result of the same query rows.

    out: (..., n, D) float32, the running output, normalised over the keys seen so far (0 in rows
    that have seen none); lse: (..., n) float32, natural-log log-sum-exp of their scores (-inf in
    rows that have seen none). out_blk, lse_blk: the same for one block of other keys; out_blk may
    be in a lower precision (float16, bfloat16: the block attention's output in q's dtype), lse_blk
    is float32 and may be -inf (a row that sees no key of the block).
    Returns (out, lse), float32, over the union of the keys: the merge above, computed so that lse
    values in the thousands, or far below zero, stay finite and exact, and a row empty on both
    sides gives out 0 and lse -inf, never NaN. Accumulate in float32 (never in out_blk's dtype).
    """
    m = torch.maximum(lse, lse_blk)                          # (..., n) the larger lse
    m = torch.where(torch.isneginf(m), 0.0, m)               # both empty: any finite reference
    w, w_blk = torch.exp(lse - m), torch.exp(lse_blk - m)    # (..., n) in [0, 1], 0 where empty
    total = w + w_blk                                        # >= 1 unless both are empty
    empty = total == 0.0
    safe = torch.where(empty, 1.0, total)
    new_out = (w[..., None] * out + w_blk[..., None] * out_blk.float()) / safe[..., None]
    new_lse = torch.where(empty, -math.inf, m + torch.log(safe))
    return new_out, new_lse


def ring_step(q, k_blk, v_blk, out, lse, *, step, rank, world, causal, zigzag, attend):
    """One step of ring attention on one rank: attend to the K/V block held, merge into (out, lse).

    q: (B, Hq, n, D), this rank's queries (its shard, in the layout ``zigzag`` says); k_blk, v_blk:
    (B, Hkv, n, D), the K/V block held at this ``step`` (0 <= step < world), which came from rank
    (rank - step) mod world and is laid out as that rank's shard; out (B, Hq, n, D) and lse
    (B, Hq, n), float32: the running result (at step 0: zeros and -inf).
    attend(q, k, v, causal=False) -> (out, lse): attention of the rows of q over the rows of k, v
    (flashlib.flash_attention with return_lse=True, the scale set): out in q's dtype, lse float32;
    ``causal=True`` is causal within the call, bottom-right (row i of nq sees key j of nk iff
    j <= i + nk - nq). Pass it slices of q, k_blk, v_blk along the positions (dim -2) to compute
    part of a block.
    Returns the new (out, lse), float32 (B, Hq, n, D) and (B, Hq, n). Skip every part of the block
    that no query of that part may see (see the module docstring); q, k_blk and v_blk must not
    change (they are being sent on to the next rank meanwhile).
    """
    src = (rank - step) % world
    if zigzag:
        ids = lambda r: (r, 2 * world - 1 - r)            # noqa: E731  the chunks a rank holds
    else:
        ids = lambda r: (r,)                               # noqa: E731
    c = q.shape[-2] // len(ids(rank))
    outs = [out[..., i * c:(i + 1) * c, :] for i in range(len(ids(rank)))]
    lses = [lse[..., i * c:(i + 1) * c] for i in range(len(ids(rank)))]
    for i, qi in enumerate(ids(rank)):
        for j, kj in enumerate(ids(src)):
            if causal and kj > qi:
                continue                                    # this key chunk is in the future
            o, l = attend(q[..., i * c:(i + 1) * c, :], k_blk[..., j * c:(j + 1) * c, :],
                          v_blk[..., j * c:(j + 1) * c, :], causal=causal and kj == qi)
            outs[i], lses[i] = merge(outs[i], lses[i], o, l)
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)

def zigzag_shard(x, rank, world):
    """The positions rank ``rank`` of ``world`` holds in the zigzag layout.

    x: (B, H, N, D) with N a multiple of 2 * world. Returns (B, H, N / world, D): chunk ``rank``
    followed by chunk 2 * world - 1 - rank of the 2 * world chunks of N / (2 * world) positions.
    """
    B, H, N, D = x.shape
    chunks = x.reshape(B, H, 2 * world, N // (2 * world), D)        # (B, H, 2W, c, D)
    return chunks[:, :, [rank, 2 * world - 1 - rank]].reshape(B, H, N // world, D)
