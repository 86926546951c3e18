"""Exercise 14 (lesson 14): ring attention's communication loop, its step, and the zigzag layout.

A sequence of N tokens is split across W ranks (GPUs, or processes), n = N / W positions each;
every rank holds the queries, keys and values of its own positions. The keys and values travel
around a ring: at step t (t = 0, 1, ..., W - 1) rank r holds the K/V block that rank (r - t) mod W
started with, attends its queries to it while sending it on to rank r + 1, and receives the next
block from rank r - 1. After W steps every query has met every key. Each step gives a partial
result (out normalised over the block's keys, lse over them), folded into the running one by
lesson 03's merge, which you are given as ``merge(out, lse, out_blk, lse_blk) -> (out, lse)``
(float32, safe for empty rows).

Layouts (``zigzag``) of the positions on the ranks:

- contiguous (``zigzag=False``): rank r holds positions [r n, (r + 1) n);
- zigzag (``zigzag=True``): the sequence is cut into 2W chunks of c = N / (2W) positions, and
  rank r holds chunk r followed by chunk 2W - 1 - r (n = 2c positions): one chunk from the start
  and one from the end of the sequence.

A K/V block is laid out as the shard of the rank it came from.

Causal attention (``causal=True``) is over the global positions: the query at position i sees the
key at position j iff j <= i. Compute only what some query may see: a part of a block that is
wholly in the future of a part of the queries is skipped, never computed and then thrown away.
This is where the layouts differ: with contiguous shards rank 0 has half a block of work and rank
W - 1 has W - 1/2; with zigzag shards every rank has the same work at every step (the lesson
draws it).

Write three functions, then run ``flashlib check ex14`` (or the lesson's check cell). Every tensor
is a torch tensor of shape (B, H, positions, D) for q, k, v and out, (B, H, positions) for lse.
``ring_attention`` runs in real processes: the grader starts 2 and 3 of them in a gloo group on
this machine (CPU tensors) and calls it on every rank.
"""
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
    part of a block. merge(out, lse, out_blk, lse_blk) -> (out, lse): folds attend's result for
    some rows into the running result of the same rows (given: lesson 03's merge, in float32).
    Returns the new (out, lse), float32 (B, Hq, n, D) and (B, Hq, n). Skip every part of the block
    that no query of that part may see (see the module docstring); q, k_blk and v_blk must not
    change (they are being sent on to the next rank meanwhile).
    """
    # BEGIN SOLUTION
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
    # END SOLUTION


def zigzag_shard(x, rank, world):
    """The positions rank ``rank`` of ``world`` holds in the zigzag layout.

    x: (B, H, N, D) with N a multiple of 2 * world. Returns (B, H, N / world, D): chunk ``rank``
    followed by chunk 2 * world - 1 - rank of the 2 * world chunks of N / (2 * world) positions.
    """
    # BEGIN SOLUTION
    c = x.shape[-2] // (2 * world)                 # chunk length
    first, last = rank, 2 * world - 1 - rank
    return torch.cat([x[..., first * c:(first + 1) * c, :], x[..., last * c:(last + 1) * c, :]],
                     dim=-2)
    # END SOLUTION


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
    # BEGIN SOLUTION
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
    # END SOLUTION
