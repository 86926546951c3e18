"""Mutant of ex14: ring_attention passes the blocks with blocking send and recv,
even ranks sending first (no deadlock, but no overlap either)."""
import math

import torch
import torch.distributed as dist

EXPECTED_HINT = 'batch_isend_irecv'


def ring_step(q, k_blk, v_blk, out, lse, *, step, rank, world, causal, zigzag, attend, merge):
    """One step of ring attention on one rank: attend to the K/V block held, merge into (out, lse).

    q: (B, Hq, n, D), this rank's queries (its shard, in the layout ``zigzag`` says); k_blk, v_blk:
    (B, Hkv, n, D), the K/V block held at this ``step`` (0 <= step < world), which came from rank
    (rank - step) mod world and is laid out as that rank's shard; out (B, Hq, n, D) and lse
    (B, Hq, n), float32: the running result (at step 0: zeros and -inf).
    attend(q, k, v, causal=False) -> (out, lse): attention of the rows of q over the rows of k, v
    (flashlib.flash_attention with return_lse=True, the scale set): out in q's dtype, lse float32;
    ``causal=True`` is causal within the call, bottom-right (row i of nq sees key j of nk iff
    j <= i + nk - nq). Pass it slices of q, k_blk, v_blk along the positions (dim -2) to compute
    part of a block. merge(out, lse, out_blk, lse_blk) -> (out, lse): folds attend's result for
    some rows into the running result of the same rows (given: lesson 03's merge, in float32).
    Returns the new (out, lse), float32 (B, Hq, n, D) and (B, Hq, n). Skip every part of the block
    that no query of that part may see (see the module docstring); q, k_blk and v_blk must not
    change (they are being sent on to the next rank meanwhile).
    """
    src = (rank - step) % world                    # the rank this K/V block started on
    if not causal:                                 # every query sees every key
        return merge(out, lse, *attend(q, k_blk, v_blk, causal=False))
    if src == rank:                                # the diagonal: local order is global order
        return merge(out, lse, *attend(q, k_blk, v_blk, causal=True))
    if not zigzag:                                 # a whole block before, or after, the queries
        if src > rank:
            return out, lse
        return merge(out, lse, *attend(q, k_blk, v_blk, causal=False))
    c = q.shape[-2] // 2                           # chunk length: rows [0, c) and [c, 2c)
    if src < rank:                                 # key chunk src is before both query chunks,
        k_first, v_first = k_blk[..., :c, :], v_blk[..., :c, :]    # 2W-1-src after both
        return merge(out, lse, *attend(q, k_first, v_first, causal=False))
    # src > rank: both key chunks lie after query chunk `rank` and before chunk 2W-1-rank
    out_2, lse_2 = merge(out[..., c:, :], lse[..., c:],
                         *attend(q[..., c:, :], k_blk, v_blk, causal=False))
    return torch.cat([out[..., :c, :], out_2], dim=-2), torch.cat([lse[..., :c], lse_2], dim=-1)


def zigzag_shard(x, rank, world):
    """The positions rank ``rank`` of ``world`` holds in the zigzag layout.

    x: (B, H, N, D) with N a multiple of 2 * world. Returns (B, H, N / world, D): chunk ``rank``
    followed by chunk 2 * world - 1 - rank of the 2 * world chunks of N / (2 * world) positions.
    """
    c = x.shape[-2] // (2 * world)                 # chunk length
    first, last = rank, 2 * world - 1 - rank
    return torch.cat([x[..., first * c:(first + 1) * c, :], x[..., last * c:(last + 1) * c, :]],
                     dim=-2)


def ring_attention(q, k, v, *, causal, zigzag, attend, merge):
    rank, world = dist.get_rank(), dist.get_world_size()
    B, Hq, n, D = q.shape
    out = torch.zeros(B, Hq, n, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, n), -math.inf, dtype=torch.float32, device=q.device)
    kv = torch.stack([k, v])
    for step in range(world):
        out, lse = ring_step(q, kv[0], kv[1], out, lse, step=step, rank=rank, world=world,
                             causal=causal, zigzag=zigzag, attend=attend, merge=merge)
        if step < world - 1:
            arriving = torch.empty_like(kv)
            if rank % 2 == 0:
                dist.send(kv, (rank + 1) % world)
                dist.recv(arriving, (rank - 1) % world)
            else:
                dist.recv(arriving, (rank - 1) % world)
                dist.send(kv, (rank + 1) % world)
            kv = arriving
    return out, lse
