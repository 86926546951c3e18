"""Lesson 14's ring attention on one machine: a simulated ring, its schedule, and real processes.

``flashlib.distributed.ring_attention`` is the library's ring (gloo on CPUs, NCCL on GPUs). This
module is what the lesson, exercise 14 and its grader need around it:

- ``CountingAttention``: the block attention a ring step calls, ``attend(q, k, v, causal=False) ->
  (out, lse)`` (flashlib's kernel, or the float64 oracle rounded to q's dtype for quick grading),
  counting the (query, key) pairs it is asked to compute;
- ``ring_step`` (one step of one rank, exercise 14's contract, from ``flashlib.distributed``'s
  pieces) and ``simulate`` (W ranks in one process, step by step, no communication);
- ``ring_loop`` (one rank's whole forward over a gloo or NCCL group: the double-buffered
  ``batch_isend_irecv`` loop of exercise 14) and ``fork_ring`` (W gloo processes forked on this
  machine, each running a function of the caller's: exercise 14's grader and the lesson run a
  learner's loop in them);
- ``schedule`` and ``plot_schedule``: which rank computes each (query, key) pair at which step, in
  the contiguous and the zigzag layout, and each rank's work per step;
- ``spawn_demo``: W gloo processes on this machine (``torch.multiprocessing``, spawned, so it runs
  under Jupyter) running ``ring_attention`` forward and backward against one process's answer
  (on GPUs with NCCL, at real sizes and timed: ``flashlib.bench.ring`` under ``torchrun``).

Limits: ``simulate`` runs the steps one after another, so it shows the schedule and the merge but
nothing of the overlap of transfer and compute; the counted pairs are what each call asks for
(a causal call counts its bottom-right triangle), not what a kernel's tiles actually load.
"""
import json
import math
import os
import socket
import tempfile
import time

import torch

from .. import distributed
from ..ops import flash_attention
from ..reference import attention_naive, attention_ref


def causal_pairs(nq: int, nk: int) -> int:
    """(query, key) pairs a bottom-right causal call of nq rows over nk keys computes."""
    return sum(min(max(i + nk - nq + 1, 0), nk) for i in range(nq))


class CountingAttention:
    """``attend(q, k, v, causal=False) -> (out, lse)`` for ring steps, counting its work.

    out is in q's dtype and lse float32 (B, Hq, nq), as ``flash_attention(..., return_lse=True)``;
    ``causal`` is bottom-right within the call. oracle: compute with ``attention_ref`` (float64,
    then rounded: quick for tiny shapes, for graders) instead of flashlib's kernel. ``pairs`` and
    ``calls`` count (query, key) position pairs and calls; they are tensors so that ``flashlib
    grade``'s student process sends them back like any argument it changed in place.
    """

    def __init__(self, *, scale=None, oracle=False):
        self.scale, self.oracle = scale, oracle
        self.pairs = torch.zeros((), dtype=torch.int64)
        self.calls = torch.zeros((), dtype=torch.int64)

    def __call__(self, q, k, v, causal=False):
        nq, nk = q.shape[-2], k.shape[-2]
        self.calls += 1
        self.pairs += causal_pairs(nq, nk) if causal else nq * nk
        if self.oracle:
            out, lse = attention_ref(q, k, v, causal=causal, scale=self.scale)
            return out.to(q.dtype), lse.float()
        return flash_attention(q, k, v, causal=causal, scale=self.scale, return_lse=True)


def ring_step(q, k_blk, v_blk, out, lse, *, step, rank, world, causal, zigzag, attend,
              merge=distributed.merge):
    """One step of one rank (exercise 14's contract): attend to the part of the held K/V block
    that some query may see and merge it into (out, lse) with ``merge`` (lesson 03's, given).
    flashlib's own answer, from ``flashlib.distributed``'s block rule."""
    layout = "zigzag" if zigzag else "contiguous"
    part = distributed._block(rank, (rank - step) % world, q.shape[-2], causal, layout)
    if part is None:                                   # wholly in the future: skipped
        return out, lse
    rows, cols, part_causal = part
    o, l = attend(q[:, :, rows], k_blk[:, :, cols], v_blk[:, :, cols], causal=part_causal)
    out, lse = out.clone(), lse.clone()
    out[:, :, rows], lse[:, :, rows] = merge(out[:, :, rows], lse[:, :, rows], o, l)
    return out, lse


def ring_loop(q, k, v, *, causal, zigzag, attend, merge=distributed.merge, step_fn=None):
    """One rank's ring attention forward over the default process group (exercise 14's contract):
    the W steps, each starting the transfer of the held K/V block to rank + 1 and the receipt of
    the next one from rank - 1 (``batch_isend_irecv``) before computing on the held block
    (``step_fn``, default ``ring_step``), and waiting after. Returns (out, lse) float32."""
    import torch.distributed as dist

    step_fn = ring_step if step_fn is None else step_fn
    rank, world = dist.get_rank(), dist.get_world_size()
    B, Hq, n, D = q.shape
    out = torch.zeros(B, Hq, n, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, n), -math.inf, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v))                                   # (2, B, Hkv, n, D): one transfer
    for step in range(world):
        if step + 1 < world:                                   # the next block, during the compute
            arriving = torch.empty_like(kv)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, kv, (rank + 1) % world),
                dist.P2POp(dist.irecv, arriving, (rank - 1) % world)])
        out, lse = step_fn(q, kv[0], kv[1], out, lse, step=step, rank=rank, world=world,
                           causal=causal, zigzag=zigzag, attend=attend, merge=merge)
        if step + 1 < world:
            for request in requests:
                request.wait()
            kv = arriving
    return out, lse


def simulate(q, k, v, world, *, causal=False, layout="contiguous", step_fn=None, attend=None):
    """Ring attention with ``world`` ranks simulated in one process, step by step.

    q: (B, Hq, N, D), k, v: (B, Hkv, N, D), the whole sequence; they are sharded with
    ``flashlib.distributed.shard``. step_fn: a ``ring_step`` (default: this module's); attend:
    default a ``CountingAttention`` with flashlib's kernel. Returns (out, lse, pairs): out float32
    (B, Hq, N, D) and lse (B, Hq, N) unsharded, pairs (world, world) int64, pairs[r, t] the
    (query, key) pairs rank r computed at step t.
    """
    step_fn = ring_step if step_fn is None else step_fn
    attend = CountingAttention() if attend is None else attend
    qs, ks, vs = ([distributed.shard(x, r, world, layout=layout) for r in range(world)]
                  for x in (q, k, v))
    B, Hq, n, D = qs[0].shape
    state = [(torch.zeros(B, Hq, n, D, dtype=torch.float32, device=q.device),
              torch.full((B, Hq, n), -math.inf, dtype=torch.float32, device=q.device))
             for _ in range(world)]
    pairs = torch.zeros(world, world, dtype=torch.int64)
    for t in range(world):
        for r in range(world):
            src = (r - t) % world                      # the block rank r holds at step t
            before = int(attend.pairs)
            state[r] = step_fn(qs[r], ks[src], vs[src], *state[r], step=t, rank=r, world=world,
                               causal=causal, zigzag=layout == "zigzag", attend=attend,
                               merge=distributed.merge)
            pairs[r, t] = int(attend.pairs) - before
    out = distributed.unshard([s[0] for s in state], layout=layout)
    lse = distributed.unshard([s[1] for s in state], layout=layout)
    return out, lse, pairs


def schedule(world, *, layout="contiguous", chunk=4):
    """Who computes what, causal: (rank, step), each (N, N) int, N = 2 * world * chunk positions.

    rank[i, j] is the rank holding query position i, step[i, j] the step at which it meets key j
    (the step its K/V block arrives); both -1 where j > i (masked: nobody computes it).
    """
    N = 2 * world * chunk
    owner = torch.empty(N, dtype=torch.long)
    for r in range(world):
        owner[distributed.positions(N, r, world, layout=layout)] = r
    rank = owner[:, None].expand(N, N).clone()                       # (N, N) the query's rank
    step = (owner[:, None] - owner[None, :]) % world                  # (N, N) arrival step
    future = torch.arange(N)[None, :] > torch.arange(N)[:, None]
    return rank.masked_fill(future, -1), step.masked_fill(future, -1)


def plot_schedule(world=4, *, chunk=4, axes=None):
    """Draw the causal N x N matrix coloured by the rank that computes each pair, the step at
    which it does (numbers), and each rank's work per step (pairs), contiguous above zigzag."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    if axes is None:
        fig, axes = plt.subplots(2, 2, figsize=(10, 9), layout="constrained",
                                 gridspec_kw={"width_ratios": [1.4, 1]})
    fig = axes[0][0].figure
    tab = [plt.get_cmap("tab10")(r) for r in range(world)]
    N = 2 * world * chunk
    edges = [x - 0.5 for x in range(0, N + 1, chunk)]            # chunk boundaries
    for row, layout in zip(axes, ("contiguous", "zigzag")):
        rank, step = schedule(world, layout=layout, chunk=chunk)
        row[0].imshow(rank + 1, cmap=ListedColormap(["white", *tab]), vmin=0, vmax=world,
                      interpolation="nearest")
        for bi in range(0, N, chunk):                  # a step number per chunk x chunk square
            for bj in range(0, bi + 1, chunk):
                low = chunk / 4 if bi == bj else 0     # under the diagonal's staircase
                row[0].text(bj + (chunk - 1) / 2, bi + (chunk - 1) / 2 + low,
                            int(step[bi + chunk - 1, bj]), ha="center", va="center", fontsize=8)
        row[0].set_xticks(edges, [""] * len(edges))
        row[0].set_yticks(edges, [""] * len(edges))
        row[0].grid(True, color="0.6", lw=0.5)
        row[0].set_xlabel(f"key position (chunks of {chunk})")
        row[0].set_ylabel("query position")
        row[0].set_title(f"{layout}: colour = rank computing, number = step", fontsize=10)
        row[0].legend(handles=[Patch(color=tab[r], label=f"rank {r}") for r in range(world)],
                      loc="upper right", fontsize=8)
        work = torch.zeros(world, world)               # (ranks, steps) pairs
        for r in range(world):
            for t in range(world):
                work[r, t] = ((rank == r) & (step == t)).sum()
        work /= (N // world) ** 2                      # in full blocks
        row[1].imshow(work, cmap="Oranges", vmin=0, vmax=1)
        for r in range(world):
            for t in range(world):
                row[1].text(t, r, f"{float(work[r, t]):.2g}", ha="center", va="center",
                            color="white" if work[r, t] > 0.6 else "black")
        row[1].set_xticks(range(world))
        row[1].set_yticks(range(world))
        row[1].set_xlabel("step")
        row[1].set_ylabel("rank")
        row[1].set_title(f"work in full blocks; per rank {[round(float(w), 2) for w in work.sum(1)]}",
                         fontsize=9)
    plt.close(fig)
    return fig


# ------------------------------------------------------------------------------------------------
# real processes: gloo on this machine

def _case_inputs(case, device, dtype):
    g = torch.Generator().manual_seed(case["seed"])
    B, Hq, Hkv, N, D = case["B"], case["Hq"], case["Hkv"], case["N"], case["D"]
    q, k, v, dout = (torch.randn(s, generator=g).to(device, dtype)
                     for s in ((B, Hq, N, D), (B, Hkv, N, D), (B, Hkv, N, D), (B, Hq, N, D)))
    return q, k, v, dout


def _check_case(case, rank, world, device, dtype=torch.float32):
    """Run one case of ring_attention on this rank; return its errors and tolerances."""
    from ..testing import attention_magnitudes, tolerance

    layout, causal = case["layout"], case["causal"]
    q, k, v, dout = _case_inputs(case, device, dtype)
    mine = [distributed.shard(x, rank, world, layout=layout).requires_grad_() for x in (q, k, v)]
    out = distributed.ring_attention(*mine, causal=causal, layout=layout)
    out.backward(distributed.shard(dout, rank, world, layout=layout))
    full = [x.double().requires_grad_() for x in (q, k, v)]          # one process's answer
    ref, _ = attention_ref(*full, causal=causal)
    ref.backward(dout.double())
    naive = [x.detach().clone().requires_grad_() for x in (q, k, v)]  # the same in q's dtype
    base = attention_naive(*naive, causal=causal)
    base.backward(dout)
    mags = attention_magnitudes(q, k, v, dout, causal=causal)
    result = {}
    for name, got, want, low, mag in (("out", out, ref, base, mags["out"]),
                                      *((f"d{x}", m.grad, f.grad, b.grad, mags[f"d{x}"])
                                        for x, m, f, b in zip("qkv", mine, full, naive))):
        want, low = (distributed.shard(t.detach(), rank, world, layout=layout) for t in (want, low))
        err = float((got.detach().double() - want).abs().max())
        result[name] = (err, tolerance(want, low, dtype, magnitude=mag))
    return result


def _worker(rank, world, port, cases, folder):
    """One spawned process: join the gloo group, run every case, write rank's results as JSON."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        results = [_check_case(case, rank, world, torch.device("cpu")) for case in cases]
    finally:
        dist.destroy_process_group()
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_env(values) -> dict:
    """Set environment variables (None removes one); returns their previous values."""
    old = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return old


def spawn_demo(world, cases, *, timeout=120.0):
    """Run ``cases`` (dicts: seed, B, Hq, Hkv, N, D, causal, layout) on ``world`` gloo processes
    spawned on this machine; returns, per case, {name: (max error over ranks, tolerance)} for out,
    dq, dk, dv against one process's float64 attention. The processes run on the CPU through
    Triton's interpreter, also on a GPU box. Raises if a process fails or runs past ``timeout``."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        saved = _set_env({"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})
        try:                                    # the children copy the environment as they start
            ctx = mp.start_processes(_worker, args=(world, _free_port(), cases, folder),
                                     nprocs=world, join=False, start_method="spawn")
        finally:
            _set_env(saved)
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=0.5):        # raises if a process failed
            if time.monotonic() > deadline:
                for process in ctx.processes:
                    process.kill()
                raise TimeoutError(f"ring demo with {world} processes took over {timeout:.0f} s")
        per_rank = []
        for r in range(world):
            with open(os.path.join(folder, f"rank{r}.json")) as f:
                per_rank.append(json.load(f))
    return [{name: (max(rank[i][name][0] for rank in per_rank), per_rank[0][i][name][1])
             for name in per_rank[0][i]} for i in range(len(cases))]


# ------------------------------------------------------------------------------------------------
# a caller's function in W forked gloo processes

def _forked(rank, world, store_path, worker, conn, timeout):
    """One forked process: join the gloo group, run ``worker(rank, world)``, send back its result
    (or the traceback of what it raised)."""
    import datetime
    import traceback

    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout))
        try:
            reply = ("ok", worker(rank, world))
        finally:
            dist.destroy_process_group()
    except BaseException as error:                 # the caller says what went wrong, and where
        reply = ("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
    conn.send(reply)
    conn.close()


def fork_ring(world, worker, *, timeout=30.0):
    """Run ``worker(rank, world)`` in ``world`` processes forked from this one, joined in a gloo
    group (CPU tensors, ``torch.distributed``'s default group); returns their results in rank
    order, each ``("ok", result)`` or ``("error", traceback text)``; a rank that has not answered
    within ``timeout`` seconds (a transfer nobody sends) gives ``("timeout", "")``, and every
    process is killed. Forked, not spawned: a child starts in milliseconds with this process's
    imports and objects (``worker`` may be any function, a learner's included), where a spawned one
    imports torch again (seconds). The children must not use CUDA (a forked CUDA context breaks).
    Linux and macOS only (fork)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        pipes, processes = [], []
        for rank in range(world):
            parent, child = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_forked, args=(rank, world, store, worker, child, timeout),
                                  daemon=True)
            process.start()
            child.close()
            pipes.append(parent)
            processes.append(process)
        deadline, results = time.monotonic() + timeout, [None] * world
        try:
            for rank, pipe in enumerate(pipes):
                try:
                    if pipe.poll(max(0.0, deadline - time.monotonic())):
                        results[rank] = pipe.recv()
                except EOFError:                   # died without a word (killed, out of memory)
                    pass
                if results[rank] is None and time.monotonic() >= deadline:
                    results[rank] = ("timeout", "")
                elif results[rank] is None:
                    results[rank] = ("error", f"rank {rank}'s process ended without a result")
        finally:
            for process in processes:
                process.join(timeout=max(0.1, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join()
    return results


def run_loop(world, loop_fn, cases, *, timeout=60.0):
    """Run ``loop_fn`` (``ring_loop``'s contract: exercise 14's ``ring_attention``) on ``world``
    forked gloo processes for each case (dicts: seed, B, Hq, Hkv, N, D, causal, zigzag), with
    flashlib's kernel as ``attend`` (through Triton's interpreter; on a GPU box, whose kernels
    this process compiled for the GPU, the forked CPU processes attend with the float64 oracle);
    returns per case the largest error over the ranks of out and of lse against one process's
    float64 attention over the whole sequence. Raises with the failing rank's traceback."""
    oracle = torch.cuda.is_available()
    def worker(rank, _):
        errors = []
        for case in cases:
            g = torch.Generator().manual_seed(case["seed"])
            B, Hq, Hkv, N, D = (case[x] for x in ("B", "Hq", "Hkv", "N", "D"))
            q, k, v = (torch.randn(s, generator=g) for s in ((B, Hq, N, D), (B, Hkv, N, D),
                                                            (B, Hkv, N, D)))
            layout = "zigzag" if case["zigzag"] else "contiguous"
            mine = [distributed.shard(x, rank, world, layout=layout) for x in (q, k, v)]
            out, lse = loop_fn(*mine, causal=case["causal"], zigzag=case["zigzag"],
                               attend=CountingAttention(oracle=oracle), merge=distributed.merge)
            ref, ref_lse = (distributed.shard(t, rank, world, layout=layout)
                            for t in attention_ref(q, k, v, causal=case["causal"]))
            errors.append((float((out.double() - ref).abs().max()),
                           float((lse.double() - ref_lse).abs().max())))
        return errors
    replies = fork_ring(world, worker, timeout=timeout)
    for rank, (status, reply) in enumerate(replies):
        if status != "ok":
            raise RuntimeError(f"rank {rank} of {world}: {status}\n{reply}")
    return [tuple(max(reply[i][j] for _, reply in replies) for j in range(2))
            for i in range(len(cases))]
