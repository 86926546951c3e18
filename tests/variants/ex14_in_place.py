"""Correct variant of ex14: ring_step updates the running out and lse in place, row slice by row
slice, and returns them; zigzag_shard by index_select of the positions."""
import math

import torch
import torch.distributed as dist


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
    part of a block.
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
    out[..., c:, :], lse[..., c:] = merge(out[..., c:, :], lse[..., c:],
                                          *attend(q[..., c:, :], k_blk, v_blk, causal=False))
    return out, lse


def zigzag_shard(x, rank, world):
    """The positions rank ``rank`` of ``world`` holds in the zigzag layout.

    x: (B, H, N, D) with N a multiple of 2 * world. Returns (B, H, N / world, D): chunk ``rank``
    followed by chunk 2 * world - 1 - rank of the 2 * world chunks of N / (2 * world) positions.
    """
    c = x.shape[-2] // (2 * world)
    where = torch.cat([torch.arange(rank * c, (rank + 1) * c),
                       torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])
    return x.index_select(-2, where.to(x.device))


def ring_attention(q, k, v, *, causal, zigzag, attend, merge):
    """This rank's ring attention forward: the W steps of the ring, with communication.

    Runs on every rank of torch.distributed's default process group (already initialised: gloo on
    CPU tensors, NCCL on GPUs); ``dist.get_rank()`` and ``dist.get_world_size()`` say which rank
    this is and how many there are. q: (B, Hq, n, D), k, v: (B, Hkv, n, D), this rank's shard in
    the layout ``zigzag`` says; causal, zigzag, attend, merge: as for ``ring_step``, which does the
    compute of each step (call yours, once per step, in order).
    Returns (out, lse), float32 (B, Hq, n, D) and (B, Hq, n): this rank's rows of attention over
    the whole sequence (start from out 0 and lse -inf: no key seen).

    The communication: before step t computes, start sending the block held at step t to rank
    (rank + 1) mod W and receiving the block of step t + 1 from rank (rank - 1) mod W, both in one
    ``dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, ...)])``, so that
    the transfer runs while the step computes (double buffering: the held block and the arriving
    one are two different tensors); then wait for the requests it returned (``.wait()``) before the
    received block is used. The block held at the last step has been everywhere: do not send it.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    B, Hq, n, D = q.shape
    out = torch.zeros(B, Hq, n, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, n), -math.inf, dtype=torch.float32, device=q.device)
    kv = torch.stack([k, v])                       # (2, B, Hkv, n, D): one send, one receive
    for step in range(world):
        last = step == world - 1
        if not last:                               # in flight while this step computes
            arriving = torch.empty_like(kv)
            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                               dist.P2POp(dist.irecv, arriving, (rank - 1) % world)])
        out, lse = ring_step(q, kv[0], kv[1], out, lse, step=step, rank=rank, world=world,
                             causal=causal, zigzag=zigzag, attend=attend, merge=merge)
        if not last:
            for request in requests:
                request.wait()
            kv = arriving                          # the block of the next step
    return out, lse
