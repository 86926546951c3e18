"""Correct variant of ex14: ring_step over (query chunk, key chunk) pairs by their global chunk
numbers (one chunk per shard when contiguous, two when zigzag), each pair skipped, causal or
full, merged one at a time; zigzag_shard by reshaping into 2W chunks."""
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
