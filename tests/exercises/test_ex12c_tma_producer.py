"""Grader of exercise 12c (lesson 12): load_kv, FlashAttention-3's producer loop in Gluon (TMA
loads of K and V into a ring of stages, mbarrier waits and expects; FA3 section 3.1).

On any machine the learner's function's Python body runs with stand-ins for Gluon's ``mbarrier``,
``tma`` and ``gl`` (``flashlib.teach.mbarrier.record``, in the student process under `flashlib
grade`: ``checks.beside``), which log its calls, at sizes drawn from
the seed: 2-4 stages, 0-13 key blocks, blocks of 64 or 128 keys, the descriptors' coordinates and
a packed sequence's first row. The log is checked as written (every block once, in order, at its
coordinates, into stage j % STAGES, completing that stage's ready barrier, one expect of one
block's bytes per copy, no wait on its own loads), then replayed against flashlib's consumers
(one or two warpgroups, with and without FA3's overlap and ping-pong) in a model of the mbarriers
(``flashlib.teach.mbarrier``): the producer racing ahead of them and in random interleavings, the
TMA landing in any order. A deadlock, a stage overwritten before its consumers released it or a
consumer's wait passing on a phase two ahead fails. On a Hopper GPU (sm90, Triton 3.6's Gluon) the
GPU check then compiles the loop into flashlib's FA3 forward (``fa3_forward(kv_loader=...)``) and
compares its output with the float64 reference; elsewhere it says why it does not run.
"""
import random

import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.kernels import fa3_fwd
from flashlib.teach import mbarrier as model

pytestmark = pytest.mark.ex12c
FLASHLIB_ALLOWED = ()          # the stub imports nothing of flashlib
# no runtime tripwire: flashlib's own loop (fa3_fwd.load_kv_ring) is a Gluon function that the
# kernel the GPU check compiles references, and a recording wrapper cannot be compiled; importing
# it is refused before anything runs (integrity.borrowed)
FLASHLIB_ANSWERS = ()
# under `flashlib grade` the log is made in the student process (checks.beside): its module is
# imported there before the student's file, as the libraries the file imports are
PRELOAD = ("flashlib.teach.mbarrier",)
NBYTES = {64: 16384, 128: 32768}     # one block's bytes: BLOCK_N rows of 128 float16 (stand-in descriptors)

HINT_COUNT = "load each block once: for j in range(n_blocks), K_j and V_j"
HINT_ROWS = "block j holds rows first_row + j * BLOCK_N ... : its third coordinate is first_row + j * BLOCK_N"
HINT_FIRST_ROW = ("packed sequences start at first_row: block j's row is first_row + j * BLOCK_N, "
                  "not j * BLOCK_N")
HINT_COORDS = "a block's coordinates are [batch, kv_head, first_row + j * BLOCK_N, 0] (batch, head, row, dim)"
HINT_STAGE = "block j goes into stage j % STAGES (STAGES is an argument: the ring may have 2, 3 or 4 stages)"
HINT_BUFFER = "K's blocks go into k_smem and V's into v_smem, stage j % STAGES"
HINT_BARRIER = ("the copy of block j completes on the ready barrier of its own kind and stage, "
                "k_ready.index(j % STAGES) for K (v_ready for V): the barrier its consumers wait on")
HINT_EXPECT = ("before each copy, mbarrier.expect(ready barrier, desc.block_type.nbytes): it is the one "
               "arrival the ready barrier waits for, and it tells it how many bytes the copy brings")
HINT_BYTES = "expect one block's bytes per copy: k_desc.block_type.nbytes (v_desc's for V), once per block"
HINT_OWN_LOADS = ("the producer never waits on a ready barrier: that waits for its own load to land and "
                  "serialises the copies the ring is there to overlap; only the consumers wait on it")
HINT_ARRIVE = ("the producer does not arrive on barriers: the consumers arrive on the empty barriers, and "
               "the producer's one arrival on a ready barrier is its expect")
HINT_PARITY = ("the producer waits on a stage's empty barrier for a phase the consumers never complete: for "
               "block j that is trip (j // STAGES) round the ring, parity ((j // STAGES) & 1) ^ 1; a fresh "
               "barrier's 'previous' phase (parity 1) counts as complete, so the first trip goes ahead")
HINT_RELEASED = ("a stage was overwritten before the consumers had released the block it held: before the "
                 "copy of block j into stage s = j % STAGES, wait on k_empty.index(s) (v_empty for V) for "
                 "parity ((j // STAGES) & 1) ^ 1")


def _sizes(rng, min_blocks=0, max_blocks=13):
    """(stages, block_n, batch, kv_head, first_row, n_blocks) drawn from the seed."""
    stages = int(rng.integers(2, 5))
    return (stages, int(rng.choice([64, 128])), int(rng.integers(0, 7)), int(rng.integers(0, 9)),
            int(rng.integers(0, 2000)), int(rng.integers(min_blocks, max_blocks + 1)))


def _record(impl, stages, block_n, batch, kv_head, first_row, n_blocks):
    fn = checks.function(impl, "load_kv")
    call = (f"load_kv(batch={batch}, kv_head={kv_head}, first_row={first_row}, n_blocks={n_blocks}, "
            f"BLOCK_N={block_n}, STAGES={stages})")
    events = checks.beside(fn, model.record, stages, NBYTES[block_n], batch, kv_head, first_row, n_blocks,
                           block_n)
    if events and events[-1][0] == "error":
        _, kind, message = events[-1]
        checks.fail(f"{call}: {message}", HINT_STAGE if kind == "index" else None)
    return events, call


def _copies(events, kind):
    return [e for e in events if e[0] == "copy" and e[1] == kind]


def check_loads(impl, rng):
    """every block of K and V loaded once, in order, at its coordinates, into stage j % STAGES,
    completing that stage's ready barrier (2-4 stages, 0-13 blocks of 64 or 128 keys)"""
    cases = [_sizes(rng) for _ in range(6)] + [(3, 64, 0, 0, 0, 0), (2, 128, 1, 3, 517, 9)]
    for stages, block_n, batch, kv_head, first_row, n_blocks in cases:
        events, call = _record(impl, stages, block_n, batch, kv_head, first_row, n_blocks)
        for kind in "kv":
            copies = _copies(events, kind)
            if len(copies) != n_blocks:
                checks.fail(f"{call} copies {len(copies)} blocks of {kind.upper()}, expected {n_blocks}",
                            HINT_COUNT)
            for j, (_, _, coord, bar, buffer) in enumerate(copies):
                row = first_row + j * block_n
                if coord != (batch, kv_head, row, 0):
                    hint = (HINT_ROWS if coord[:2] == (batch, kv_head) and coord[2] == first_row + j
                            else HINT_FIRST_ROW if coord[:2] == (batch, kv_head) and coord[2] == j * block_n
                            else HINT_COORDS)
                    checks.fail(f"{call}: copy {j} of {kind.upper()} is at {list(coord)}, block {j}'s "
                                f"coordinates are {[batch, kv_head, row, 0]}", hint)
                if buffer[0] != f"{kind}_smem":
                    checks.fail(f"{call}: block {j} of {kind.upper()} is copied into {buffer[0]}", HINT_BUFFER)
                if buffer[1] != j % stages:
                    checks.fail(f"{call}: block {j} of {kind.upper()} is copied into stage {buffer[1]} "
                                f"of {stages}, not {j % stages}", HINT_STAGE)
                if bar != (f"{kind}_ready", j % stages):
                    checks.fail(f"{call}: the copy of {kind.upper()} block {j} completes on "
                                f"{bar[0]}.index({bar[1]})", HINT_BARRIER)


def check_expects(impl, rng):
    """one mbarrier.expect of one block's bytes on each copy's ready barrier, no wait on a ready
    barrier (the producer's own loads) and no other arrival"""
    for stages, block_n, batch, kv_head, first_row, n_blocks in [_sizes(rng, 1) for _ in range(6)]:
        events, call = _record(impl, stages, block_n, batch, kv_head, first_row, n_blocks)
        for event in events:
            if event[0] == "arrive":
                checks.fail(f"{call} arrives on {event[1][0]}.index({event[1][1]})", HINT_ARRIVE)
            if event[0] == "wait" and event[1][0].endswith("ready"):
                checks.fail(f"{call} waits on {event[1][0]}.index({event[1][1]})", HINT_OWN_LOADS)
            if event[0] == "expect" and event[1][0].endswith("empty"):
                checks.fail(f"{call} expects bytes on {event[1][0]}.index({event[1][1]})", HINT_EXPECT)
            if event[0] == "expect" and event[2] != NBYTES[block_n]:
                checks.fail(f"{call} expects {event[2]} bytes on {event[1][0]}.index({event[1][1]}), "
                            f"a block is {NBYTES[block_n]}", HINT_BYTES)
        for bar in {e[3] for e in events if e[0] == "copy"}:
            copies = sum(e[0] == "copy" and e[3] == bar for e in events)
            expects = sum(e[0] == "expect" and e[1] == bar for e in events)
            if expects != copies:
                checks.fail(f"{call}: {copies} copies complete on {bar[0]}.index({bar[1]}) and it "
                            f"receives {expects} expects", HINT_EXPECT)


def _replay(impl, rng, num_wg, overlap, pingpong, min_blocks, max_blocks, rounds=6):
    """The learner's events against flashlib's consumers, the producer first and in random orders."""
    for _ in range(rounds):
        stages, block_n, batch, kv_head, first_row, n_blocks = _sizes(rng, min_blocks, max_blocks)
        events, call = _record(impl, stages, block_n, batch, kv_head, first_row, n_blocks)
        for order in ("first", int(rng.integers(1 << 30)), int(rng.integers(1 << 30))):
            ring = model.Ring(num_wg, stages, block=lambda kind, j: (kind, (batch, kv_head, first_row + j * block_n, 0)))
            parts = {"producer": model.replay(ring, events, NBYTES[block_n]),
                     **{f"consumer {w}": model.consumer(ring, w, n_blocks, overlap, pingpong, q_loaded=False)
                        for w in range(num_wg)}}
            try:
                model.interleave(ring, parts, random.Random(0 if order == "first" else order),
                                 producer_first=order == "first")
            except model.ProtocolError as e:
                who = f"{num_wg} consumer warpgroup{'s' if num_wg > 1 else ''}" + (
                    " (FA3's overlap" + (" and ping-pong)" if pingpong else ")") if overlap else "")
                race = "with the producer racing ahead" if order == "first" else "in a random interleaving"
                producer_stuck = e.kind == "deadlock" and "the producer waits" in str(e)
                hint = (HINT_PARITY if producer_stuck else HINT_EXPECT if e.kind == "deadlock"
                        else HINT_RELEASED)   # overwrite, wrong block, a phase two ahead, an expect too many
                checks.fail(f"{call} against {who}, {race}: {e}", hint)


def check_first_trip(impl, rng):
    """no deadlock while every block has a stage of its own (n_blocks <= STAGES: fresh barriers),
    one consumer warpgroup"""
    _replay(impl, rng, 1, False, False, 1, 2)


def check_ring_reuse(impl, rng):
    """many trips round the ring (up to 13 blocks in 2-4 stages): no stage overwritten before its
    consumer released it, no deadlock, one consumer warpgroup"""
    _replay(impl, rng, 1, False, False, 3, 13)


def check_two_consumers(impl, rng):
    """two consumer warpgroups (the stage is free once both released it), with and without FA3's
    intra-warpgroup overlap and ping-pong"""
    _replay(impl, rng, 2, False, False, 0, 13, rounds=3)
    _replay(impl, rng, 2, True, True, 0, 13, rounds=3)


CHECKS = [check_loads, check_expects, check_first_trip, check_ring_reuse, check_two_consumers]


def gpu_checks_unavailable():
    """Why the GPU check cannot run on this machine (None: it can)."""
    import torch
    import triton

    from flashlib import runtime
    if not runtime.HAS_CUDA or runtime.INTERPRET:
        return "no GPU here"
    major, minor = runtime.capability(torch.device("cuda", torch.cuda.current_device()))
    if major != 9:
        return f"this GPU is sm{major}{minor}; the kernel needs Hopper (sm90)"
    if not triton.__version__.startswith(fa3_fwd.TESTED_TRITON):
        return f"Triton {triton.__version__} here; the FA3 kernel is written for Triton 3.6's Gluon"
    return None


def check_gpu_in_fa3_kernel(impl, rng):
    """compiled for the GPU: your loop as the producer of flashlib's FA3 forward, float16, against
    the float64 reference: 1 and 2 consumers, d 64 and 128, causal, grouped heads, ragged lengths
    and packed sequences"""
    import torch

    from flashlib import testing
    from flashlib.reference import attention_naive, attention_ref
    why = gpu_checks_unavailable()
    if why is not None:
        checks.fail(f"the GPU check cannot run: {why}")
    fn = checks.function(impl, "load_kv")
    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 31)))

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=gen)

    cases = [("simple", 64, False, (2, 6, 2, 700, 1531)), ("2wg_pingpong", 128, True, (1, 8, 2, 1000, 1000)),
             ("2wg", 64, False, (1, 2, 1, 64, 100))]
    for variant, D, causal, (B, Hq, Hkv, Nq, Nk) in cases:
        q, k, v = randn(B, Hq, Nq, D), randn(B, Hkv, Nk, D), randn(B, Hkv, Nk, D)
        out, _ = fa3_fwd.fa3_forward(q, k, v, causal=causal, variant=variant, kv_loader=fn)
        torch.cuda.synchronize()
        want, _ = attention_ref(q, k, v, causal=causal)
        try:
            testing.assert_close(out, want, baseline=attention_naive(q, k, v, causal=causal),
                                 name=f"out ({variant}, d{D}, causal={causal})")
        except AssertionError as e:
            checks.fail(f"inside the FA3 kernel, B={B} Hq={Hq} Hkv={Hkv} Nq={Nq} Nk={Nk}: {e}", HINT_RELEASED)
    lengths = [300, 1, 0, 517]                          # packed: first_row is each sequence's offset
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), device="cuda", dtype=torch.int32)
    q, k, v = (randn(int(cu[-1]), h, 128) for h in (4, 2, 2))
    out, _ = fa3_fwd.fa3_forward(q, k, v, causal=True, cu_seqlens=(cu, cu), max_seqlen=(517, 517),
                                 kv_loader=fn)
    for i, n in enumerate(lengths):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        as4 = lambda t: t[rows].transpose(0, 1).unsqueeze(0)   # noqa: E731  (1, H, n, D)
        want, _ = attention_ref(as4(q), as4(k), as4(v), causal=True)
        try:
            testing.assert_close(as4(out), want, baseline=attention_naive(as4(q), as4(k), as4(v), causal=True),
                                 name=f"out of packed sequence {i}")
        except AssertionError as e:
            checks.fail(f"inside the FA3 kernel, packed sequences {lengths}: {e}", HINT_FIRST_ROW)


# run only on a GPU (`flashlib check` runs them after CHECKS pass, where gpu_checks_unavailable allows)
GPU_CHECKS = [check_gpu_in_fa3_kernel]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex12c(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=grading.check_id)
def test_ex12c_gpu(check, exercise_impl, grader_seed):
    why = gpu_checks_unavailable()
    if why is not None:
        pytest.skip(why)
    grading.pytest_run(check, exercise_impl, grader_seed)
