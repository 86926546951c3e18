"""Grader of exercise 14 (lesson 14): ring_attention (the ring's communication loop), ring_step
and zigzag_shard.

ring_step is driven through a simulated ring of W = 1 to 4 ranks in one process (no
communication): at step t rank r gets the K/V block of rank (r - t) mod W, a
flashlib.teach.ring.CountingAttention (the float64 oracle rounded to q's dtype, counting the
(query, key) pairs asked for) and lesson 03's merge (flashlib's, given), so every step is held to
the exact work it needs (no masked block computed, no visible key skipped) and to the float64
attention over the keys seen so far; the final shards to attention_ref over the whole sequence.
Contiguous and zigzag layouts, causal and not, grouped heads, float32, float16 and bfloat16
blocks, scores in the hundreds.

ring_attention runs for real: flashlib.teach.ring.fork_ring forks a gloo group of 2 processes and
one of 3 (milliseconds each: forked, not spawned), and every rank calls the learner's function on
its shard of the same sequence, for every case of the check, in one group. In each process the
grader records, by wrapping torch.distributed's batch_isend_irecv, send and recv, the learner's
ring_step and the requests' wait(): what every transfer sends and receives and to whom, which
transfers are still in flight when each step computes, and which block each step is given
(recognised by its values among every rank's shards). So the hints name the mistake: blocking
send/recv, the wrong neighbour, waiting before computing (no overlap), computing on a block
before its transfer is waited for, receiving into the block being sent, sending the wrong block,
the received block never used, a block dropped or a transfer too many, the wrong step. Under
``flashlib grade`` this check is left out (not_under_grade): the learner's code would run in
processes outside the sandbox.
"""
import importlib
import math
import sys
import traceback

import numpy as np
import pytest
import torch

from flashlib import distributed
from flashlib.course import checks, grading, integrity
from flashlib.reference import attention_naive, attention_ref
from flashlib.teach.ring import CountingAttention, fork_ring, simulate
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex14
# what a learner's file may use of flashlib (the stub imports none of it); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is reached
# (flashlib.course.integrity.tripwire); merge is given to the learner, not an answer
FLASHLIB_ANSWERS = ("flashlib.distributed.shard", "flashlib.distributed.positions",
                    "flashlib.distributed._block", "flashlib.teach.ring.ring_step",
                    "flashlib.teach.ring.ring_loop", "flashlib.teach.ring.simulate")
merge = distributed.merge                   # what the learner is given, lesson 03's merge

HINT_FLOAT32 = ("keep the running out and lse float32 (merge returns float32): never round them to "
                "q's float16 or bfloat16 between steps, the next steps need the bits")
HINT_SOURCE = ("at step t rank r holds the K/V block that rank (rank - step) mod world started "
               "with: every step each block moves on to the next rank, r + 1")
HINT_FUTURE = ("a block whose keys all lie after this rank's queries is wholly in the future under "
               "the causal mask: skip it (return out and lse as they are), do not compute it and "
               "throw it away")
HINT_BEFORE = ("a block from an earlier rank lies wholly before this rank's queries: every query "
               "sees every key of it, so attend to all of it with causal=False")
HINT_NOT_CAUSAL = ("not causal: every query sees every key, so every block is attended to whole "
                   "(causal=False), at every step")
HINT_DIAGONAL = ("the block a rank holds at step 0 is its own, the diagonal: query i sees only the "
                 "keys j <= i there, so attend with causal=True (in both layouts the shard's order "
                 "is the global order)")
HINT_ZIGZAG_BEFORE = ("zigzag, a block from rank src < rank: its first chunk (src) lies before both "
                      "of your chunks and its second (2W-1-src) after both, so all your queries "
                      "attend to its first chunk only: k_blk[..., :c, :], v_blk[..., :c, :]")
HINT_ZIGZAG_AFTER = ("zigzag, a block from rank src > rank: both its chunks lie after your first "
                     "chunk (rank) and before your second chunk (2W-1-rank), so only your second "
                     "chunk's queries, q[..., c:, :], attend to the whole block; the first chunk's "
                     "rows of out and lse stay as they are")
HINT_SHARD = ("the zigzag shard of rank r is chunk r followed by chunk 2*world - 1 - r of the "
              "2*world chunks of N / (2*world) positions (rank 0: the first and the last chunk)")


# ------------------------------------------------------------------------------------------------
# merge

def _tensor(x, dtype=torch.float32):
    return torch.from_numpy(np.asarray(x, dtype=np.float64)).to(dtype)


def _pair(name, result, out, lse, where, why):
    """The (out, lse) pair a learner's function returned, or a failure saying what came back."""
    if not isinstance(result, (tuple, list)) or len(result) != 2 or \
            not all(isinstance(t, torch.Tensor) for t in result):
        checks.fail(f"{name} returned {type(result).__name__}{where}; it should return the pair of "
                    "tensors (out, lse)")
    new_out, new_lse = result
    if tuple(new_out.shape) != tuple(out.shape) or tuple(new_lse.shape) != tuple(lse.shape):
        checks.fail(f"{name} returned out {tuple(new_out.shape)} and lse {tuple(new_lse.shape)}"
                    f"{where}; expected {tuple(out.shape)} and {tuple(lse.shape)}: {why}")
    return new_out, new_lse



# ------------------------------------------------------------------------------------------------
# zigzag_shard

def _positions(N, rank, world, zigzag):
    """The global positions rank holds, in shard order (the grader's own, not flashlib's)."""
    if not zigzag:
        n = N // world
        return list(range(rank * n, (rank + 1) * n))
    c = N // (2 * world)
    return [*range(rank * c, (rank + 1) * c), *range((2 * world - 1 - rank) * c,
                                                      (2 * world - rank) * c)]


def check_zigzag_shard(impl, rng):
    """zigzag_shard: rank r of W holds chunk r, then chunk 2W-1-r (W = 1 to 4, chunks of 1 and 3
    positions); together the shards hold every position once"""
    fn = checks.function(impl, "zigzag_shard")
    for world in (1, 2, 3, 4):
        for c in (1, 3):
            N = 2 * world * c
            x = _tensor(rng.standard_normal((2, 3, N, 5)))
            x[:, :, :, 0] = torch.arange(N, dtype=torch.float32)   # column 0 holds the position
            for rank in range(world):
                before = x.clone()
                got = fn(x, rank, world)
                if not torch.equal(x, before):
                    checks.fail("zigzag_shard changed x in place: return a new tensor")
                want = x[:, :, _positions(N, rank, world, True)]
                if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
                    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                    checks.fail(f"zigzag_shard(x of {N} positions, rank={rank}, world={world}) "
                                f"returned {shape}; expected {tuple(want.shape)}", HINT_SHARD)
                if not torch.equal(got, want):
                    held = [int(p) for p in got[0, 0, :, 0].tolist()]
                    checks.fail(f"zigzag_shard(x of {N} positions, rank={rank}, world={world}) "
                                f"holds positions {held}; expected "
                                f"{_positions(N, rank, world, True)}", HINT_SHARD)


# ------------------------------------------------------------------------------------------------
# ring_step, driven through a simulated ring

def _kind(rank, src, world, causal, zigzag):
    """What the block rank holds from src is, in words."""
    if not causal:
        return f"rank {src}'s block: not causal, every query sees every key"
    if src == rank:
        return "its own block, the diagonal: causal within it"
    if not zigzag:
        return f"rank {src}'s block, wholly {'before' if src < rank else 'after'} its queries"
    if src < rank:
        return (f"rank {src}'s chunks {src} and {2 * world - 1 - src}: the first before both of its "
                "query chunks, the second after both")
    return (f"rank {src}'s chunks {src} and {2 * world - 1 - src}: both after its first query "
            f"chunk ({rank}), both before its second ({2 * world - 1 - rank})")


def _hint_for(rank, src, causal, zigzag, done, needed):
    """The hint for a step that computed ``done`` (query, key) pairs where ``needed`` were due."""
    if not causal:
        return HINT_NOT_CAUSAL if done < needed else HINT_SOURCE
    if src == rank:
        return HINT_DIAGONAL
    if zigzag:
        return HINT_ZIGZAG_BEFORE if src < rank else HINT_ZIGZAG_AFTER
    if src > rank:
        return HINT_FUTURE
    return HINT_SOURCE if done == 0 else HINT_BEFORE


def _visible(q_pos, k_pos, causal):
    """(n, m) bool: query q_pos[i] sees key k_pos[j]."""
    q_pos, k_pos = torch.tensor(q_pos), torch.tensor(k_pos)
    return (k_pos[None, :] <= q_pos[:, None]) if causal else torch.ones(len(q_pos), len(k_pos),
                                                                          dtype=torch.bool)


def _step(impl, args, kwargs, where):
    """The learner's ring_step on copies; checks what it returned and that q, k, v are unchanged."""
    fn = checks.function(impl, "ring_step")
    q, k, v, out, lse = args
    copies = [t.clone() for t in args]
    result = fn(*copies, **kwargs)
    for name, before, after in zip(("q", "k_blk", "v_blk"), (q, k, v), copies):
        if not torch.equal(before, after):
            checks.fail(f"ring_step changed {name} in place ({where}): the block is being sent on "
                        "to the next rank meanwhile; compute into new tensors")
    new_out, new_lse = _pair("ring_step", result, out, lse, f" ({where})",
                             "every query row of the rank, also rows left unchanged")
    if new_out.dtype != torch.float32 or new_lse.dtype != torch.float32:
        checks.fail(f"ring_step returned out {new_out.dtype} and lse {new_lse.dtype} ({where}, "
                    f"q {q.dtype}): the running result stays float32", HINT_FLOAT32)
    return new_out, new_lse


def _ring(impl, q, k, v, world, *, causal, zigzag, what):
    """Run the learner's ring_step for every rank and step; hold each step to its work and to the
    float64 attention over the keys seen so far; return the final (out, lse) of every rank."""
    B, Hq, N, D = q.shape
    pos = [_positions(N, r, world, zigzag) for r in range(world)]
    shards = [[x[:, :, p] for p in pos] for x in (q, k, v)]             # [tensor, qkv][rank]
    n = N // world
    state = [(torch.zeros(B, Hq, n, D), torch.full((B, Hq, n), -math.inf)) for _ in range(world)]
    seen = [[] for _ in range(world)]
    loose = 1e-4 if q.dtype == torch.float32 else 2e-2
    for t in range(world):
        for r in range(world):
            src = (r - t) % world
            attend = CountingAttention(oracle=True)
            where = f"{what}, rank {r} at step {t}, holding {_kind(r, src, world, causal, zigzag)}"
            kwargs = dict(step=t, rank=r, world=world, causal=causal, zigzag=zigzag, attend=attend,
                          merge=merge)
            args = (shards[0][r], shards[1][src], shards[2][src], *state[r])
            state[r] = _step(impl, args, kwargs, where)
            needed = int(_visible(pos[r], pos[src], causal).sum())
            done = int(attend.pairs)
            if done != needed:
                checks.fail(f"{where}: asked attend for {done} (query, key) pairs; "
                            f"{'only ' if done > needed else ''}{needed} of them are visible to "
                            "some query",
                            _hint_for(r, src, causal, zigzag, done, needed))
            seen[r] += pos[src]
            mask = _visible(pos[r], seen[r], causal)
            ref_out, ref_lse = attention_ref(shards[0][r], k[:, :, seen[r]], v[:, :, seen[r]],
                                             mask=mask)
            out, lse = state[r]
            bad = torch.isnan(out).any() or torch.isnan(lse).any() or not torch.equal(
                torch.isneginf(lse), torch.isneginf(ref_lse))
            scale_out = 1.0 + float(ref_out.abs().max())
            scale_lse = 1.0 + float(ref_lse[torch.isfinite(ref_lse)].abs().max())
            if bad or float((out.double() - ref_out).abs().max()) > loose * scale_out or \
                    float((lse.double() - ref_lse).nan_to_num(0.0).abs().max()) > loose * scale_lse:
                checks.fail(f"{where}: the running (out, lse) is not attention over the keys seen "
                            f"so far", _hint_for(r, src, causal, zigzag, needed, needed))
    return [s for s in state], pos


def _expect_ring(impl, q, k, v, world, *, causal, zigzag, what):
    layout = "zigzag" if zigzag else "contiguous"
    what = f"{what}, {world} ranks, {layout}{', causal' if causal else ''}"
    finals, pos = _ring(impl, q, k, v, world, causal=causal, zigzag=zigzag, what=what)
    ref, ref_lse = attention_ref(q, k, v, causal=causal)
    naive = attention_naive(q, k, v, causal=causal)
    ring_out, ring_lse, _ = simulate(q, k, v, world, causal=causal, layout=layout,
                                     attend=CountingAttention(oracle=True))
    mags = attention_magnitudes(q, k, v, causal=causal)
    for r, (out, lse) in enumerate(finals):
        p = pos[r]
        checks.expect_close(out, ref[:, :, p], baseline=(naive[:, :, p], ring_out[:, :, p]),
                            dtype=q.dtype, name=f"rank {r}'s out ({what})",
                            hint=HINT_FLOAT32,
                            magnitude=mags["out"])
        checks.expect_close(lse, ref_lse[:, :, p], baseline=ring_lse[:, :, p], dtype=torch.float32,
                            name=f"rank {r}'s lse ({what})", hint=HINT_FLOAT32,
                            magnitude=mags["lse"])


def _qkv(rng, N, dtype, *, B=1, Hq=4, Hkv=2, D=16, spread=1.0):
    return [_tensor(spread * rng.standard_normal(s), dtype)
            for s in ((B, Hq, N, D), (B, Hkv, N, D), (B, Hkv, N, D))]


def check_ring_not_causal(impl, rng):
    """ring_step, not causal: 1 to 4 ranks, both layouts, 4 query heads over 2 K/V heads: every rank
    attends to every whole block once and ends with attention over the whole sequence"""
    for world, zigzag in ((1, False), (2, True), (3, False), (4, True)):
        q, k, v = _qkv(rng, 2 * world * 3, torch.float32)
        _expect_ring(impl, q, k, v, world, causal=False, zigzag=zigzag, what="float32")


def check_ring_causal_contiguous(impl, rng):
    """ring_step, causal, contiguous shards (2, 3 and 4 ranks): the diagonal block causal, blocks
    before the queries whole, blocks after them skipped; exact attention, no wasted work"""
    for world in (2, 3, 4):
        q, k, v = _qkv(rng, world * 5, torch.float32)
        _expect_ring(impl, q, k, v, world, causal=True, zigzag=False, what="float32")


def check_ring_causal_zigzag(impl, rng):
    """ring_step, causal, zigzag shards (2, 3 and 4 ranks): half a block of work on every rank at
    every step after the first; exact attention"""
    for world in (2, 3, 4):
        q, k, v = _qkv(rng, 2 * world * 3, torch.float32)
        _expect_ring(impl, q, k, v, world, causal=True, zigzag=True, what="float32")


def check_ring_low_precision_large_scores(impl, rng):
    """ring_step with float16 and bfloat16 inputs and scores in the hundreds (lse past float32's
    exp range): the running out and lse stay float32 and finite; exact attention"""
    for dtype, zigzag, world in ((torch.float16, True, 3), (torch.bfloat16, False, 2)):
        q, k, v = _qkv(rng, 2 * world * 4, dtype, spread=9.0)
        _expect_ring(impl, q, k, v, world, causal=True, zigzag=zigzag, what=f"{dtype}, large scores")




# ------------------------------------------------------------------------------------------------
# ring_attention, in real processes (gloo)

HINT_BLOCKING = ("start both transfers with torch.distributed.batch_isend_irecv (an isend to the next "
                 "rank, an irecv from the previous one) and compute while they run; a blocking "
                 "send or recv finishes its transfer before the compute starts, so nothing overlaps")
HINT_NEIGHBOUR = ("send to rank (rank + 1) % world and receive from rank (rank - 1) % world: the "
                  "blocks travel one way round the ring, so that at step t you hold the block of "
                  "rank (rank - t) % world")
HINT_OVERLAP = ("double buffering: start the transfer (batch_isend_irecv) before the step computes "
                "and wait for it after ring_step returns; waiting first makes the link and the "
                "compute take turns")
HINT_WAIT_FIRST = ("wait for the transfer (.wait() on every request batch_isend_irecv returned) "
                   "before you use the received block: until then its buffer may still be filling")
HINT_FRESH_BUFFER = ("receive into a new buffer (torch.empty_like), not into the block you are "
                     "sending and computing with: both transfers are in flight while the step "
                     "reads it")
HINT_SEND_HELD = ("send on the block you hold at this step (the one received last), not your own "
                  "first block: every block must travel all the way round the ring")
HINT_USE_RECEIVED = ("after the wait, the received block is the one for the next step: hold it "
                     "(kv = received) instead of computing your own block again")
HINT_STEPS = ("W steps: call ring_step once per step, step = 0, 1, ..., W - 1, the last one on the "
              "block received last")
HINT_EXTRA_SEND = ("W - 1 transfers: the block held at the last step has visited every rank, so "
                   "do not send it on (that is a wasted transfer of a whole block)")
HINT_STEP_ARGS = ("pass ring_step this step's number (0, 1, ..., W - 1), your rank and the world "
                  "size from torch.distributed, and causal and zigzag as you were given them")
HINT_START = ("start from out 0 and lse -inf (float32: no key seen yet), return what ring_step "
              "returned after the last step, and make ring_step pass its own checks first")
RING_TIMEOUT = 10.0                         # seconds for a group's every case; the solution: ~0.1


def _case_tensors(case):
    """The whole sequence's q, k, v of a case, the same on every rank (its own generator)."""
    g = torch.Generator().manual_seed(case["seed"])
    B, Hq, Hkv, N, D = (case[x] for x in ("B", "Hq", "Hkv", "N", "D"))
    return [torch.randn(shape, generator=g).to(case["dtype"])
            for shape in ((B, Hq, N, D), (B, Hkv, N, D), (B, Hkv, N, D))]


def _recorded_run(impl, cases):
    """The function each forked rank runs: every case through the learner's ring_attention, with
    torch.distributed's transfers and the learner's ring_step recorded. Returns, per case, the
    events, the transfers, and out and lse (NumPy, float64) or the error raised."""
    import torch.distributed as dist

    def run(rank, world):
        real = {name: getattr(dist, name) for name in ("batch_isend_irecv", "send", "recv")}
        real_step = impl.ring_step
        now = {}                                        # the case being run
        storage = lambda t: t.untyped_storage().data_ptr()          # noqa: E731

        def source_of(t):
            """Which rank's K/V shard ``t`` holds (K, V, or both stacked), -1 if none."""
            for src, (ks, vs) in enumerate(now["shards"]):
                if tuple(t.shape) == tuple(ks.shape) and (torch.equal(t, ks) or torch.equal(t, vs)):
                    return src
                if tuple(t.shape) == (2, *ks.shape) and torch.equal(t[0], ks) and torch.equal(t[1], vs):
                    return src
            return -1

        class Request:
            """A request of batch_isend_irecv whose wait() is recorded."""
            def __init__(self, work, batch):
                self.work, self.batch = work, batch

            def wait(self, *args, **kwargs):
                self.batch["waited"] += 1
                return self.work.wait(*args, **kwargs)

            def __getattr__(self, name):
                return getattr(self.work, name)

        def batch_isend_irecv(ops):
            ops = list(ops)
            batch = dict(sends=[], recvs=[], waited=0)
            for op in ops:
                kind = "sends" if op.op is dist.isend else "recvs"
                batch[kind].append((int(op.peer), storage(op.tensor),
                                    source_of(op.tensor) if kind == "sends" else None))
            works = real["batch_isend_irecv"](ops)
            batch["requests"] = len(works)
            now["batches"].append(batch)
            return [Request(w, batch) for w in works]

        def blocking(name):
            def call(*args, **kwargs):
                now["blocking"].append(name)
                return real[name](*args, **kwargs)
            return call

        def ring_step(q, k_blk, v_blk, out, lse, **kwargs):
            pending = [b for b in now["batches"] if b["waited"] < b["requests"]]
            now["steps"].append(dict(
                args={x: kwargs.get(x) for x in ("step", "rank", "world", "causal", "zigzag")},
                source=source_of(k_blk), pending=len(pending),
                unwaited=any(storage(k_blk) == r[1] or storage(v_blk) == r[1]
                             for b in pending for r in b["recvs"])))
            return real_step(q, k_blk, v_blk, out, lse, **kwargs)

        def watched(module, name):
            """flashlib's answer ``name``, recording a call made from the learner's file (the
            tripwire of ``flashlib check`` records in the grader's process, not in this one)."""
            original = getattr(module, name)

            def call(*args, **kwargs):
                frame = sys._getframe(1)
                while frame is not None:
                    if frame.f_code.co_filename == getattr(impl, "__file__", None):
                        now["answers"].append(f"{module.__name__}.{name}")
                        break
                    frame = frame.f_back
                return original(*args, **kwargs)
            return call

        for dotted in FLASHLIB_ANSWERS:
            module_name, name = dotted.rsplit(".", 1)
            module = importlib.import_module(module_name)
            setattr(module, name, watched(module, name))
        dist.batch_isend_irecv, dist.send, dist.recv = (batch_isend_irecv, blocking("send"),
                                                         blocking("recv"))
        impl.ring_step = ring_step                      # this forked copy of the module only
        fn = checks.function(impl, "ring_attention")
        results = []
        for case in cases:
            q, k, v = _case_tensors(case)
            pos = [_positions(case["N"], r, world, case["zigzag"]) for r in range(world)]
            now.update(shards=[(k[:, :, p], v[:, :, p]) for p in pos], steps=[], batches=[],
                       blocking=[], answers=[])
            result = dict(error=None, not_done=None)
            try:
                got = fn(q[:, :, pos[rank]].clone(), k[:, :, pos[rank]].clone(),
                         v[:, :, pos[rank]].clone(), causal=case["causal"], zigzag=case["zigzag"],
                         attend=CountingAttention(oracle=True), merge=merge)
                result["reply"] = [(str(t.dtype), tuple(t.shape), t.detach().double().numpy())
                                   if isinstance(t, torch.Tensor) else (type(t).__name__, None, None)
                                   for t in (got if isinstance(got, (tuple, list)) else [got])]
            except NotImplementedError as error:        # the stub: "not done", as in one process
                result["not_done"] = str(error)
            except Exception as error:                  # the learner's, reported with its line
                frames = [f for f in traceback.extract_tb(error.__traceback__)
                          if f.filename == getattr(impl, "__file__", None)]
                where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
                result["error"] = f"{type(error).__name__}: {error}{where}"
            result.update({x: now[x] for x in ("steps", "batches", "blocking", "answers")})
            results.append(result)
            dist.barrier()                              # no transfer of one case meets the next's
        return results
    return run


def _problem(case, rank, world, result):
    """The first thing wrong with one rank's run of one case, as (message, hint), or None."""
    where = (f"rank {rank} of {world} ({'causal' if case['causal'] else 'not causal'}, "
             f"{'zigzag' if case['zigzag'] else 'contiguous'}, {case['N']} positions)")
    if result["answers"]:
        return integrity.NOT_ACCEPTED.format(why=f"calls {result['answers'][0]}, flashlib's own "
                                             "answer"), None
    if result["error"] is not None:
        return f"ring_attention raised on {where}: {result['error']}", None
    if result["blocking"]:
        return f"{where}: ring_attention called torch.distributed.{result['blocking'][0]}", \
            HINT_BLOCKING
    steps, batches = result["steps"], result["batches"]
    if len(steps) != world:
        return f"{where}: ring_step was called {len(steps)} times; the ring has {world} steps", \
            HINT_STEPS
    for t, step in enumerate(steps):
        want = dict(step=t, rank=rank, world=world, causal=case["causal"], zigzag=case["zigzag"])
        if step["args"] != want:
            return f"{where}: call {t} of ring_step got {step['args']}; expected {want}", \
                HINT_STEP_ARGS
    if len(batches) > world - 1:
        return f"{where}: {len(batches)} transfers for {world} steps", HINT_EXTRA_SEND
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for i, batch in enumerate(batches):
        peers = ([p for p, _, _ in batch["sends"]], [p for p, _, _ in batch["recvs"]])
        if not batch["sends"] or not batch["recvs"] or set(peers[0]) != {nxt} or \
                set(peers[1]) != {prev}:
            return (f"{where}: transfer {i} sends to ranks {peers[0]} and receives from "
                    f"{peers[1]}; expected sends to {nxt} and receives from {prev}"), HINT_NEIGHBOUR
        if {s for _, s, _ in batch["sends"]} & {s for _, s, _ in batch["recvs"]}:
            return f"{where}: transfer {i} receives into the tensor it sends", HINT_FRESH_BUFFER
    for t, step in enumerate(steps):
        if step["unwaited"]:
            return (f"{where}: step {t} computed on a block whose transfer had not been waited "
                    "for"), HINT_WAIT_FIRST
    for t, step in enumerate(steps[:-1]):
        if not step["pending"]:
            return (f"{where}: no transfer was in flight while step {t} computed (the next block "
                    "had not been started, or was already waited for)"), HINT_OVERLAP
    for i, batch in enumerate(batches):           # transfer i overlaps step i (checked above)
        held = (rank - i) % world
        sent = [src for _, _, src in batch["sends"] if src not in (-1, held)]
        if sent:
            return (f"{where}: the transfer started at step {i} sends rank {sent[0]}'s block; the "
                    f"block held then is rank {held}'s"), HINT_SEND_HELD
    for t, step in enumerate(steps):
        src = (rank - t) % world
        if step["source"] != src:
            if step["source"] == rank:
                return (f"{where}: step {t} was given this rank's own block again; it should hold "
                        f"rank {src}'s"), HINT_USE_RECEIVED
            got = "no rank's K" if step["source"] < 0 else f"rank {step['source']}'s block"
            return f"{where}: step {t} was given {got}; at step {t} it holds rank {src}'s", \
                HINT_NEIGHBOUR if step["source"] == (rank + t) % world else HINT_STEPS
    if len(batches) < world - 1:
        return f"{where}: {len(batches)} transfers for {world} steps", HINT_OVERLAP
    return None


def _expect_ring_processes(impl, rng, world, cases):
    for case in cases:
        case.update(seed=int(rng.integers(2**31)), B=int(rng.integers(1, 3)),
                    D=int(rng.choice([8, 12, 16])), N=2 * world * int(rng.integers(1, 4)))
        case["Hq"], case["Hkv"] = [(4, 2), (2, 2), (3, 1)][int(rng.integers(3))]
    replies = fork_ring(world, _recorded_run(impl, cases), timeout=RING_TIMEOUT)
    for rank, (status, reply) in enumerate(replies):
        if status == "timeout":
            checks.fail(f"ring_attention did not return on rank {rank} of {world} within "
                        f"{RING_TIMEOUT:.0f} s: some rank waits for a transfer that no rank makes",
                        "each rank sends W - 1 times to rank + 1 and receives W - 1 times from "
                        "rank - 1, in one batch_isend_irecv per step")
        if status == "error":
            checks.fail(f"rank {rank} of {world} failed: {reply.strip().splitlines()[-1]}")
    for results in (reply for _, reply in replies):
        if results[0]["not_done"] is not None:
            raise NotImplementedError(results[0]["not_done"])
    for i, case in enumerate(cases):
        q, k, v = _case_tensors(case)
        ref, ref_lse = attention_ref(q, k, v, causal=case["causal"])
        for rank, (_, results) in enumerate(replies):
            found = _problem(case, rank, world, results[i])
            if found is not None:
                checks.fail(*found)
            reply = results[i]["reply"]
            p = _positions(case["N"], rank, world, case["zigzag"])
            want = (ref[:, :, p], ref_lse[:, :, p])
            if len(reply) != 2 or any(a[0] != "torch.float32" or a[1] != tuple(w.shape)
                                      for a, w in zip(reply, want)):
                checks.fail(f"ring_attention returned {[a[:2] for a in reply]} on rank {rank}; "
                            f"expected out float32 {tuple(want[0].shape)} and lse float32 "
                            f"{tuple(want[1].shape)}", HINT_FLOAT32)
            loose = 1e-4 if case["dtype"] == torch.float32 else 2e-2   # blocks rounded to q's dtype
            for (_, _, got), w, name in zip(reply, want, ("out", "lse")):
                got = torch.from_numpy(got)
                finite = torch.isfinite(w)
                if not torch.equal(torch.isfinite(got), finite) or \
                        float((got - w)[finite].abs().max()) > loose * (1 + float(w[finite].abs().max())):
                    checks.fail(f"rank {rank} of {world}'s {name} is not attention over the whole "
                                f"sequence ({'causal' if case['causal'] else 'not causal'}, "
                                f"{'zigzag' if case['zigzag'] else 'contiguous'})", HINT_START)


@checks.not_under_grade
def check_ring_attention_two_processes(impl, rng):
    """ring_attention in 2 gloo processes: causal and not, both layouts, grouped heads; every
    transfer double-buffered (in flight while the step computes), out and lse exact"""
    _expect_ring_processes(impl, rng, 2, [dict(causal=False, zigzag=False, dtype=torch.float32),
                                          dict(causal=True, zigzag=True, dtype=torch.float32)])


@checks.not_under_grade
def check_ring_attention_three_processes(impl, rng):
    """ring_attention in 3 gloo processes: blocks go to rank + 1 and come from rank - 1, the block
    held is sent on, W - 1 transfers each overlapping a step, float16 inputs, out and lse exact"""
    _expect_ring_processes(impl, rng, 3, [dict(causal=True, zigzag=False, dtype=torch.float32),
                                          dict(causal=False, zigzag=True, dtype=torch.float16),
                                          dict(causal=True, zigzag=True, dtype=torch.float32)])


CHECKS = [check_zigzag_shard, check_ring_not_causal, check_ring_causal_contiguous,
          check_ring_causal_zigzag, check_ring_low_precision_large_scores,
          check_ring_attention_two_processes, check_ring_attention_three_processes]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex14(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
