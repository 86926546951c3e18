"""Ring attention: exact attention over a sequence sharded across the ranks of a process group.

Follows Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite
Context" (2023), section 3: W ranks each hold a shard of the queries, keys and values; the K/V
shards travel around a ring, one hop per step, while every rank attends its queries to the block
it holds and merges the block's (out, lse) into its running result, the merge of lesson 03. Each
block runs on the kernel version ``flash_attention`` would pick for it (``kernels/dispatch.py``:
FlashAttention-3's on Hopper where it wins, FlashAttention-2's elsewhere and through the CPU's
interpreter), forward and backward. After W steps each query has met every key; the transfer of
the next block overlaps the compute and the merge of this one. The backward keeps the global out
and lse, sends K/V around again and sends the dK/dV accumulators with them, so they arrive home
after W hops.

Layouts (``layout=``), for a global sequence of N = W * n positions:

- ``"contiguous"``: rank r holds positions [r*n, (r+1)*n). Under causal masking rank r needs only
  the blocks of ranks s <= r, so the last rank works W times as long as the first.
- ``"zigzag"``: the sequence is cut into 2W chunks and rank r holds chunks r and 2W-1-r (an early
  and a late one), so every rank does the same causal work: each step after the first is half a
  block (Brandon et al., "Striped Attention", 2023, balance causal work the same way; zigzag is
  the chunking of Megatron's and PyTorch's context parallelism). ``shard``/``unshard`` convert.

``causal`` is bottom-right over global positions with equal shards, i.e. the usual causal mask.
Limits: every rank must pass q, k, v of one shape, dtype and device (only local checks are made:
a mismatch across ranks fails inside torch.distributed), and every rank must call backward when
one does. lse has no gradient (as in ``flash_attention``). Each block's out is rounded to q's dtype
by the kernel before the float32 merge: in float16 that costs about one ulp more than one kernel.
The first call compiles the kernels (and, with autotuning on, tunes FA2's) on every rank;
``warm_up`` does it before the ring starts, one rank first so that the others read Triton's
disk cache and the tuned configs (``kernels.config.SavedChoices``).
"""
import torch

from . import runtime
from .inputs import check_inputs
from .kernels import dispatch
from .kernels.score_mod import IDENTITY

LAYOUTS = ("contiguous", "zigzag")
__all__ = ["LAYOUTS", "Ring", "RingAttention", "merge", "positions", "ring_attention", "schedule",
           "shard", "step_backward", "step_forward", "unshard", "warm_up"]


def merge(out_a, lse_a, out_b, lse_b):
    """Merge two partial attention results over disjoint keys (lesson 03), in float32.

    out_*: (..., n, D) each normalised over its own keys; lse_*: (..., n) natural log, -inf where a
    part had no key (its out is 0). Returns (out, lse): out = sum of exp(lse_part - lse) * out_part,
    lse = log(exp(lse_a) + exp(lse_b)); a row empty in both gets out 0 and lse -inf, never NaN.
    """
    lse = torch.logaddexp(lse_a.float(), lse_b.float())                   # (..., n)
    ref = torch.where(torch.isneginf(lse), 0.0, lse)                      # both empty: weights 0
    w_a = torch.exp(lse_a - ref).unsqueeze(-1)                            # (..., n, 1)
    w_b = torch.exp(lse_b - ref).unsqueeze(-1)
    return torch.addcmul(out_a.float() * w_a, out_b.float(), w_b), lse   # (..., n, D)


def positions(seqlen, rank, world, *, layout="contiguous", device=None):
    """Global positions (a LongTensor, in shard order) that ``rank`` of ``world`` holds."""
    _check_layout(layout)
    for name, value in (("world", world), ("rank", rank), ("seqlen", seqlen)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world) with world >= 1, got rank={rank}, world={world}")
    parts = world if layout == "contiguous" else 2 * world
    if seqlen % parts:
        raise ValueError(f"seqlen={seqlen} does not split into {parts} equal chunks "
                         f"({layout} layout, world={world}): pad the sequence to a multiple of {parts}")
    c = seqlen // parts
    chunks = [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in chunks])


def shard(x, rank, world, *, layout="contiguous", dim=2):
    """The part of the full sequence ``x`` (sequence along ``dim``) that ``rank`` holds."""
    return x.index_select(dim, positions(x.shape[dim], rank, world, layout=layout, device=x.device))


def unshard(shards, *, layout="contiguous", dim=2):
    """The full sequence from every rank's shard, ``shards`` in rank order (inverse of ``shard``)."""
    shards = list(shards)
    if not shards:
        raise ValueError("shards is empty: pass one tensor per rank, in rank order")
    world, n = len(shards), shards[0].shape[dim]
    order = torch.cat([positions(n * world, r, world, layout=layout) for r in range(world)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return torch.cat(shards, dim).index_select(dim, inverse.to(shards[0].device))


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _block(rank, src, n, causal, layout):
    """Which part of the block (rank's queries, src's keys) to compute, or None to skip it.

    Returns (query rows, key rows, causal within the part) as slices of the local shards. With
    zigzag, rank r holds chunks (r, 2W-1-r) and src s chunks (s, 2W-1-s): for s < r both query
    chunks see s's early chunk only; for s > r only r's late chunk sees anything, all of s.
    """
    whole = slice(0, n)
    if not causal:
        return whole, whole, False
    if src == rank:                      # the diagonal: causal inside the shard, either layout
        return whole, whole, True
    if layout == "contiguous":
        return (whole, whole, False) if src < rank else None
    half = slice(0, n // 2), slice(n // 2, n)
    return (whole, half[0], False) if src < rank else (half[1], whole, False)


def schedule(rank, world, n, *, causal, layout):
    """What ``rank`` of a ring of ``world`` computes at each step, for shards of n positions: a list
    of W parts (rows, cols, causal within the part) of the local shards, None where it skips the
    block. Step t holds the block of rank (rank - t) mod W; step 0, the diagonal, has every row."""
    return [_block(rank, (rank - step) % world, n, causal, layout) for step in range(world)]


class Ring:
    """The ring of a process group: sends to rank + 1 and receives from rank - 1 (modulo W).

    ``transfer=False`` moves nothing (each rank keeps its own tensors): the same compute without
    communication, which the benchmark times to see how much of the transfer is hidden.
    """

    def __init__(self, group=None, *, transfer=True):
        import torch.distributed as dist

        if not dist.is_available():
            raise ValueError("group: this torch build has no torch.distributed")
        if not dist.is_initialized():
            raise ValueError("group: torch.distributed is not initialised: call "
                             "torch.distributed.init_process_group(backend, ...) on every rank first")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a torch.distributed ProcessGroup or None (the default "
                            f"group), got {type(group).__name__}")
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if self.rank < 0:
            raise ValueError("group: this process is not a member of the group it was given")
        self.backend = str(dist.get_backend(group)).lower()
        whole = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(whole, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(whole, (self.rank - 1) % self.world)
        self.transfer = transfer and self.world > 1

    def check_device(self, t):
        """ValueError when the group's backend cannot send tensors on ``t``'s device."""
        kind = t.device.type
        backends = (dict(part.split(":") for part in self.backend.split(",")) if ":" in self.backend
                    else {"cpu": self.backend, "cuda": self.backend})
        name = backends.get(kind)
        if name is None or (name == "nccl" and kind != "cuda") or (name == "gloo" and kind != "cpu"):
            raise ValueError(f"q is on {t.device} but the group's backend is {self.backend!r}: use "
                             "gloo with CPU tensors and nccl with CUDA tensors")

    def start(self, t, tag=0):
        """Start sending ``t`` to the next rank and receiving its like from the previous one;
        returns a function that waits and gives the received tensor."""
        if not self.transfer:
            return lambda: t
        import torch.distributed as dist

        received = torch.empty_like(t)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, self.next, self.group, tag),
                                       dist.P2POp(dist.irecv, received, self.prev, self.group, tag)])

        def wait():
            for req in reqs:
                req.wait()
            return received
        return wait


def step_forward(q, kv, part, state=None, *, scale, options):
    """One forward step of this rank: the query rows of ``part`` against the key columns of the
    held block, by the kernel version ``flash_attention`` would run for them (``kernels/dispatch.py``),
    merged in float32 into ``state``.

    q: (B, Hq, n, D), this rank's shard; kv: (2, B, Hkv, n, D), the held block's K and V; part:
    (rows, cols, causal within the part), slices of the shards (``schedule``); state: (out, lse) of
    the blocks before, None for none. Returns the new (out (B, Hq, n, D), lse (B, Hq, n) float32):
    the first block over every row is returned as the kernel gave it (out in q's dtype, no merge).
    """
    rows, cols, causal = part
    o, l = dispatch.forward(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], causal, scale,
                            IDENTITY, options)                    # (B, Hq, m, D), (B, Hq, m)
    if state is None:
        if o.shape == q.shape:
            return o, l
        state = (torch.zeros(q.shape, dtype=torch.float32, device=q.device),
                 torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device))
    out, lse = state
    merged = merge(out[:, :, rows], lse[:, :, rows], o, l)
    if merged[0].shape == out.shape:       # every row: the merge's own tensors are the state
        return merged
    out = out.float()                      # a copy only while out is still a kernel's
    out[:, :, rows], lse[:, :, rows] = merged
    return out, lse


def step_backward(q, kv, out, lse, dout, part, *, scale, options):
    """One backward step of this rank: the held block's share of the gradients, (dq of ``part``'s
    rows, dk and dv of its columns) in q's dtype, by the kernel version ``flash_attention``'s
    backward would run. out, lse, dout: this rank's GLOBAL out (B, Hq, n, D), lse (B, Hq, n) and
    out's gradient; given them, the kernels give exactly this block's contribution. q, kv, part:
    as ``step_forward``'s."""
    rows, cols, causal = part
    return dispatch.backward(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], out[:, :, rows],
                             lse[:, :, rows], dout[:, :, rows], causal, scale, IDENTITY, options)


def ring_forward(q, k, v, ring, *, causal, scale, layout, options):
    """The forward's W steps; returns (out like q, lse (B, Hq, n) float32). Inputs checked;
    options: a ``runtime.KernelOptions``. The merge of step j runs while block j + 1 is in flight."""
    n = q.shape[2]
    state = None
    kv = torch.stack((k, v))                                              # (2, B, Hkv, n, D)
    for step, part in enumerate(schedule(ring.rank, ring.world, n, causal=causal, layout=layout)):
        pending = ring.start(kv) if step + 1 < ring.world else None      # overlaps the compute
        if part is not None:
            state = step_forward(q, kv, part, state, scale=scale, options=options)
        if pending is not None:
            kv = pending()
    out, lse = state
    return out.to(q.dtype), lse


def ring_backward(q, k, v, out, lse, dout, ring, *, causal, scale, layout, options):
    """The backward's W steps from the global out and lse; returns (dq, dk, dv) of this rank's
    shards. dK/dV accumulate in float32 and travel with their K/V block, home after W hops."""
    n = q.shape[2]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)      # (B, Hq, n, D)
    kv = torch.stack((k, v))                                              # (2, B, Hkv, n, D)
    dkv_pending = None
    for step, part in enumerate(schedule(ring.rank, ring.world, n, causal=causal, layout=layout)):
        kv_pending = ring.start(kv) if step + 1 < ring.world else None
        if part is not None:
            dq_b, dk_b, dv_b = step_backward(q, kv, out, lse, dout, part, scale=scale, options=options)
            dq[:, :, part[0]] += dq_b
        # the accumulators of the block now held: the previous rank's, or zeros at the start
        dkv = (dkv_pending() if dkv_pending is not None
               else torch.zeros(kv.shape, dtype=torch.float32, device=q.device))  # (2, B, Hkv, n, D)
        if part is not None:
            dkv[0][:, :, part[1]] += dk_b
            dkv[1][:, :, part[1]] += dv_b
        dkv_pending = ring.start(dkv, tag=1)   # on to the next rank; the W-th hop brings it home
        if kv_pending is not None:
            kv = kv_pending()
    dq = dq.to(q.dtype)                        # queued before the wait: under the last hop
    dkv = dkv_pending()
    return dq, dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class RingAttention(torch.autograd.Function):
    """Ring attention as one autograd node; saves this rank's q, k, v, out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, ring, causal, scale, layout, options):
        out, lse = ring_forward(q, k, v, ring, causal=causal, scale=scale, layout=layout,
                                options=options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.scale, ctx.layout, ctx.options = ring, causal, scale, layout, options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        # gradients materialise as zeros: every rank must take part in the ring, used or not
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, out, lse, dout, ctx.ring, causal=ctx.causal,
                                   scale=ctx.scale, layout=ctx.layout, options=ctx.options)
        return dq, dk, dv, None, None, None, None, None


def _check_shards(q, k, v, causal, scale, layout):
    """ring_attention's checks (and warm_up's); returns the resolved scale."""
    scale = check_inputs(q, k, v, scale=scale, causal=causal)
    _check_layout(layout)
    n = q.shape[2]
    if k.shape[2] != n:
        raise ValueError(f"q has {n} positions but k and v have {k.shape[2]}: ring_attention "
                         "needs every shard of q, k and v to be the same length")
    if layout == "zigzag" and n % 2:
        raise ValueError(f"the zigzag layout needs an even shard length (two chunks), got n={n}")
    return scale


def ring_attention(q, k, v, *, group=None, causal=False, scale=None, return_lse=False,
                   layout="contiguous", kernel_options=None):
    """This rank's shard of exact attention over a sequence sharded across ``group``'s ranks.

    q: (batch, heads_q, n, headdim); k, v: (batch, heads_kv, n, headdim), heads_q % heads_kv == 0:
    this rank's shard of the sequence. With ``layout="contiguous"`` rank r holds global positions
    [r*n, (r+1)*n); with ``"zigzag"`` (n even) the 2W chunks r and 2W-1-r, which balances causal
    work (``shard``/``unshard``/``positions`` convert a full sequence). Every rank must call this
    with the same shapes, dtype, options and kind of device.
    group: a torch.distributed ProcessGroup (default: the default group), initialised with gloo
    for CPU tensors (kernels through Triton's interpreter) or nccl for CUDA tensors.
    causal: query at global position i sees keys j <= i. scale: defaults to 1/sqrt(headdim).
    return_lse: also return lse (batch, heads_q, n), float32, natural log, over the whole sequence.
    kernel_options: as ``flash_attention``'s, for every step (forward and backward).
    Returns out (like q) or (out, lse). Differentiable: every rank's gradients are those of the
    sum of all ranks' losses with respect to its own shards (every rank must call backward).
    """
    options = runtime.options(kernel_options)
    scale = _check_shards(q, k, v, causal, scale, layout)
    ring = Ring(group)
    ring.check_device(q)
    out, lse = RingAttention.apply(q, k, v, ring, causal, scale, layout, options)
    return (out, lse) if return_lse else out


def warm_up(q, k, v, *, group=None, causal=False, scale=None, layout="contiguous", kernel_options=None):
    """Compile (and, with autotuning on, tune) every kernel the ring will run on shards like q, k, v,
    forward and backward, before the ring runs: rank 0 of ``group`` first, alone, then the others.

    Arguments as ``ring_attention``'s; every rank of ``group`` must call it. Every kind of block any
    rank computes (each a different shape or mask) runs once on this rank's own tensors, without
    communication. The others start after rank 0 has finished, so they load its compiled kernels
    from Triton's disk cache instead of compiling them, and its autotuned configs from flashlib's
    (``kernels.config.SavedChoices``): every rank then runs the configs picked once, by rank 0.
    """
    import torch.distributed as dist

    options = runtime.options(kernel_options)
    scale = _check_shards(q, k, v, causal, scale, layout)
    ring = Ring(group)
    ring.check_device(q)
    n, world = q.shape[2], ring.world
    parts = {}                                   # one of each kind: (rows, cols) bounds, causal
    for rank in range(world):
        for part in filter(None, schedule(rank, world, n, causal=causal, layout=layout)):
            rows, cols, part_causal = part
            parts[(rows.start, rows.stop, cols.start, cols.stop, part_causal)] = part
    kv = torch.stack((k, v))                     # (2, B, Hkv, n, D), as the ring holds it
    lse = torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device)

    @torch.no_grad()
    def run():
        for part in parts.values():
            step_forward(q, kv, part, scale=scale, options=options)
            step_backward(q, kv, q, lse, q, part, scale=scale, options=options)  # values: any
    if ring.rank == 0:
        run()
    if world > 1:
        dist.barrier(group)
        if ring.rank != 0:
            run()
