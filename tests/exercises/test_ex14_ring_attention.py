"""Grader of exercise 14 (lesson 14): merge, ring_step and zigzag_shard, ring attention's pieces.

merge is compared with the float64 merge of the same inputs (blocks of real attention over uneven
key splits, lse in the thousands and near -30000, empty parts and rows) under flashlib.testing's
rule (baselines: the textbook merge and the merge through logaddexp, in float32). ring_step is
driven through a simulated ring of W = 1 to 4 ranks in one process (no communication): at step t
rank r gets the K/V block of rank (r - t) mod W and a flashlib.teach.ring.CountingAttention (the
float64 oracle rounded to q's dtype, counting the (query, key) pairs asked for), so every step is
held to the exact work it needs (no masked block computed, no visible key skipped) and to the
float64 attention over the keys seen so far; the final shards to attention_ref over the whole
sequence. Contiguous and zigzag layouts, causal and not, 4 query heads over 2 K/V heads, float32,
float16 and bfloat16 blocks, scores in the hundreds. Probes name the mistake: no max subtracted,
NaN on empty rows, lse not merged, plain average, float16 accumulation, the wrong source rank,
future blocks computed, the diagonal not causal, the zigzag halves.
"""
import math

import numpy as np
import pytest
import torch

from flashlib.course import checks, grading
from flashlib.reference import attention_naive, attention_ref
from flashlib.teach.ring import CountingAttention, simulate
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex14
# what a learner's file may use of flashlib (the stub imports none of it); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is reached
# (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.distributed.merge", "flashlib.distributed.shard",
                    "flashlib.distributed.positions", "flashlib.distributed._block",
                    "flashlib.teach.ring.ring_step", "flashlib.teach.ring.simulate")

HINT_OVERFLOW = ("exp(lse) overflows: lse can be in the hundreds or thousands (88.7 is float32's "
                 "limit). Subtract the larger of the two lse first, so that both exponents are <= 0")
HINT_EMPTY = ("a row empty on both sides (lse = lse_blk = -inf) must give out 0 and lse -inf, not "
              "NaN: -inf - (-inf) is NaN, so use 0 as the reference where the larger lse is -inf")
HINT_LSE = ("return the merged lse = log(exp(lse) + exp(lse_blk)), the log-sum-exp over both parts' "
            "keys, not one of the two: the next merge weighs the running result by it")
HINT_WEIGHTS = ("weigh each part by its share of the softmax's mass: out = exp(lse - lse_new) out "
                "+ exp(lse_blk - lse_new) out_blk, weights that sum to 1 (a plain average, or "
                "weights exp(lse) not divided by their sum, is wrong)")
HINT_FLOAT32 = ("accumulate in float32: upcast the block's output (out_blk.float()) and keep the "
                "running out and lse float32; rounding them to the block's float16 or bfloat16 "
                "at every step loses bits the next steps need")
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


def _merge_call(impl, out, lse, out_blk, lse_blk):
    """The learner's merge on copies; checks the pair returned (float32, shapes)."""
    fn = checks.function(impl, "merge")
    result = fn(out.clone(), lse.clone(), out_blk.clone(), lse_blk.clone())
    new_out, new_lse = _pair("merge", result, out, lse, "", "like its out and lse")
    if new_out.dtype != torch.float32 or new_lse.dtype != torch.float32:
        checks.fail(f"merge returned out {new_out.dtype} and lse {new_lse.dtype} (out_blk "
                    f"{out_blk.dtype}); both must be float32", HINT_FLOAT32)
    return new_out, new_lse


def _merge64(out, lse, out_blk, lse_blk):
    """The oracle: the same merge in float64 (empty rows: 0 and -inf)."""
    o = torch.stack([out.double(), out_blk.double()])                     # (2, ..., n, D)
    l = torch.stack([lse.double(), lse_blk.double()])                     # (2, ..., n)
    new = torch.logsumexp(l, dim=0)
    w = torch.exp(l - torch.where(torch.isneginf(new), 0.0, new))         # 0 where empty
    return (w[..., None] * o).sum(0), new


def _textbook(out, lse, out_blk, lse_blk):
    """The merge in float32 with the max subtracted: a tolerance baseline."""
    m = torch.maximum(lse, lse_blk)
    m = torch.where(torch.isneginf(m), 0.0, m)
    a, b = torch.exp(lse - m), torch.exp(lse_blk - m)
    s = torch.where(a + b == 0, 1.0, a + b)
    return (a[..., None] * out + b[..., None] * out_blk.float()) / s[..., None], \
        torch.where(a + b == 0, -math.inf, m + torch.log(s))


def _log_space(out, lse, out_blk, lse_blk):
    """The merge in float32 through logaddexp (weights exp(lse_part - lse)): a second baseline,
    whose rounding follows |lse|."""
    new = torch.logaddexp(lse, lse_blk)
    ref = torch.where(torch.isneginf(new), 0.0, new)
    return (torch.exp(lse - ref)[..., None] * out
            + torch.exp(lse_blk - ref)[..., None] * out_blk.float()), new


def _probe(impl, lse_pair, outs=None, dtype=torch.float32):
    """merge of two one-row parts (D = 2) with the given lse; None if the learner's merge fails."""
    outs = np.eye(2) if outs is None else outs
    args = (_tensor(outs[0]).reshape(1, 1, 1, 2), _tensor([lse_pair[0]]).reshape(1, 1, 1),
            _tensor(outs[1], dtype).reshape(1, 1, 1, 2), _tensor([lse_pair[1]]).reshape(1, 1, 1))
    try:
        out, lse = checks.function(impl, "merge")(*args)
        return out.double().reshape(2).numpy(), float(lse.double().reshape(()))
    except Exception:
        return None


def _diagnose_merge(impl):
    """The first hint whose mistake the learner's merge makes on small probes, or None."""
    got = _probe(impl, [0.0, math.log(3.0)])            # the block holds 3x the mass
    if got is None:
        return None
    out, lse = got
    if not np.allclose(out, [0.25, 0.75], rtol=1e-5):
        if np.allclose(out, [0.5, 0.5], rtol=1e-5) or np.allclose(out, [1.0, 3.0], rtol=1e-5):
            return HINT_WEIGHTS
        return None
    if not math.isclose(lse, math.log(4.0), rel_tol=1e-5):
        return HINT_LSE
    got = _probe(impl, [300.0, 300.0 + math.log(3.0)])
    if got is not None and not (np.all(np.isfinite(got[0])) and math.isfinite(got[1])):
        return HINT_OVERFLOW
    got = _probe(impl, [-math.inf, -math.inf], outs=np.zeros((2, 2)))
    if got is not None and (np.isnan(got[0]).any() or not math.isinf(got[1])):
        return HINT_EMPTY
    fine = 1.0 + 2.0 ** -20                             # a float32 value float16 cannot hold
    got = _probe(impl, [0.5, -math.inf], outs=np.array([[fine, -fine], [0.0, 0.0]]),
                 dtype=torch.float16)
    if got is not None and not np.allclose(got[0], [fine, -fine], rtol=2.0 ** -22, atol=0):
        return HINT_FLOAT32
    return None


def _expect_merge(impl, out, lse, out_blk, lse_blk, what, default_hint, magnitude=None):
    new_out, new_lse = _merge_call(impl, out, lse, out_blk, lse_blk)
    ref_out, ref_lse = _merge64(out, lse, out_blk, lse_blk)
    hint = lambda: _diagnose_merge(impl) or default_hint  # noqa: E731
    what = f"{what} (out_blk {out_blk.dtype})"
    if torch.isnan(new_out).any() or torch.isnan(new_lse).any():
        checks.fail(f"merge returned NaN for {what}", hint())
    if not torch.equal(torch.isneginf(new_lse), torch.isneginf(ref_lse)):
        checks.fail(f"merge's lse is -inf in the wrong rows for {what}: exactly the rows empty on "
                    "both sides have seen no key", hint())
    bases = list(zip(_textbook(out, lse, out_blk, lse_blk), _log_space(out, lse, out_blk, lse_blk)))
    mags = magnitude or {}
    checks.expect_close(new_out, ref_out, baseline=bases[0], dtype=torch.float32,
                        name=f"out for {what}", hint=hint, magnitude=mags.get("out"))
    checks.expect_close(new_lse, ref_lse, baseline=bases[1], dtype=torch.float32,
                        name=f"lse for {what}", hint=hint, magnitude=mags.get("lse"))


def check_merge_real_parts(impl, rng):
    """merge: two parts of real attention (an uneven split of the keys, one part a single key)
    give attention over all the keys, for float32, float16 and bfloat16 blocks"""
    q, k, v = (_tensor(rng.standard_normal(s), torch.float64)
               for s in ((2, 3, 17, 24), (2, 3, 41, 24), (2, 3, 41, 24)))
    for dtype, cut in ((torch.float32, int(rng.integers(2, 40))), (torch.float16, 1),
                       (torch.bfloat16, 40)):
        out, lse = attention_ref(q, k[:, :, :cut], v[:, :, :cut])
        out_b, lse_b = attention_ref(q, k[:, :, cut:], v[:, :, cut:])
        _expect_merge(impl, out.float(), lse.float(), out_b.to(dtype), lse_b.float(),
                      f"keys [0, {cut}) and [{cut}, 41)",
                      "out = exp(lse - lse_new) out + exp(lse_blk - lse_new) out_blk")


def check_merge_large_and_far(impl, rng):
    """merge: lse in the hundreds and thousands (past exp's range), far apart, and far below zero
    (near -30000) stay finite and right"""
    for base in (300.0, 3000.0, -3e4):
        lse = rng.uniform(base, base + 3, (2, 2, 9))
        lse_blk = rng.uniform(base - 2, base + 2, (2, 2, 9))
        lse_blk[0, :, :3] = base + 150.0                    # the block dominates these rows
        lse[1, :, :3] = base + 150.0                         # the running result these
        out, out_blk = rng.standard_normal((2, 2, 2, 9, 16))
        w = np.exp(np.stack([lse, lse_blk]) - np.logaddexp(lse, lse_blk))   # the weights
        mags = {"out": float((w[..., None] * (1 + np.abs(np.stack([lse, lse_blk])))[..., None]
                              * np.abs(np.stack([out, out_blk]))).sum(0).max()),
                "lse": abs(base) + 160.0}
        _expect_merge(impl, _tensor(out), _tensor(lse), _tensor(out_blk), _tensor(lse_blk),
                      f"lse around {base:g}", "subtract the larger lse before exponentiating",
                      magnitude=mags)


def check_merge_empty(impl, rng):
    """merge: an empty part (lse -inf, out 0) leaves the other exactly as it was (float32 to the
    last bit), the first merge into (0, -inf) gives the block, a block of zero values counts with
    its weight, and a row empty on both sides gives out 0 and lse -inf, never NaN"""
    out = rng.standard_normal((1, 2, 8, 16)) * (1 + 2.0 ** -20)    # bits float16 cannot hold
    lse = rng.normal(0, 3, (1, 2, 8))
    out_blk = rng.standard_normal((1, 2, 8, 16))
    lse_blk = rng.normal(0, 3, (1, 2, 8))
    lse_blk[:, :, :3] = -np.inf                                     # the block is empty here
    out_blk[:, :, :3] = 0.0
    lse[:, :, 3:5] = -np.inf                                        # the running result here
    out[:, :, 3:5] = 0.0
    lse[:, :, 5] = lse_blk[:, :, 5] = -np.inf                       # both empty
    out[:, :, 5] = out_blk[:, :, 5] = 0.0
    out_blk[:, :, 6] = 0.0                                          # values 0, lse finite
    for dtype in (torch.float32, torch.float16):
        _expect_merge(impl, _tensor(out), _tensor(lse), _tensor(out_blk, dtype), _tensor(lse_blk),
                      "empty rows (-inf) on one side, the other or both",
                      "a part with lse -inf has weight exp(-inf) = 0; both empty: out 0, lse -inf")
        new_out, _ = _merge_call(impl, _tensor(out), _tensor(lse), _tensor(out_blk, dtype),
                                 _tensor(lse_blk))
        kept = _tensor(out)[:, :, :3]
        if not torch.allclose(new_out[:, :, :3], kept, rtol=2.0 ** -22, atol=0.0):
            checks.fail(f"merging an empty block (lse_blk -inf, out_blk {dtype}) changed the "
                        "running out: it must stay as it was, to float32's last bit",
                        _diagnose_merge(impl) or HINT_FLOAT32)


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
            kwargs = dict(step=t, rank=r, world=world, causal=causal, zigzag=zigzag, attend=attend)
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
                            f"so far", _diagnose_merge(impl) or
                            _hint_for(r, src, causal, zigzag, needed, needed))
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
                            hint=lambda: _diagnose_merge(impl) or HINT_FLOAT32,
                            magnitude=mags["out"])
        checks.expect_close(lse, ref_lse[:, :, p], baseline=ring_lse[:, :, p], dtype=torch.float32,
                            name=f"rank {r}'s lse ({what})", hint=lambda: _diagnose_merge(impl),
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


CHECKS = [check_merge_real_parts, check_merge_large_and_far, check_merge_empty, check_zigzag_shard,
          check_ring_not_causal, check_ring_causal_contiguous, check_ring_causal_zigzag,
          check_ring_low_precision_large_scores]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex14(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
