"""Grader of exercise 04 (lesson 04): fa2_tile_update, FA2's inner step, and fa2_forward around it.

fa2_tile_update(scores, v_block, m, l, acc) -> (m, l, acc) is first called directly (one update,
against the float64 formulas, and on rows that are all -inf), then plugged into
flashlib.teach.tiled.fa2_forward(..., tile_update=fn) and compared with attention_ref under
flashlib.testing's rule (baseline: textbook attention in the same dtype, or the library's own
FA2 when that rounds more) on irregular shapes: 9 heads, head dim 80, Nq != Nk, block sizes that
do not divide N, causal with Nq > Nk (query rows with no key). Probes name the mistake: no
rescale of l or acc, block max instead of running max, division by l inside the loop, NaN on
fully masked rows.

fa2_forward(q, k, v, *, block_q, block_k, causal, scale) -> (out, lse), the learner's whole
forward, is compared the same way on the same kinds of shapes, 2-D and 4-D, with scores in the
thousands, and causal with Nq < Nk, Nq = Nk + 1 (a row's last key first in its block) and
Nq > Nk. In this process (not under ``flashlib grade``, where the learner's reads happen in
another process) q, k and v are also handed over as recorders writing one shared log of the
rows each read takes: every read is at most a tile, and no key tile is read while the query
tile being computed lies wholly before it (a causal tile above the diagonal must be skipped, not
computed and masked). Probes name the mistake: top-left causal alignment, the diagonal
excluded, the diagonal's key block skipped, NaN on rows that see no key, a last query or key
block dropped, padded keys left unmasked, lse without the max.
"""
import numpy as np
import pytest

from flashlib.course import checks, grading
from flashlib.reference import attention_ref
from flashlib.testing import attention_magnitudes
from flashlib.teach.tiled import block_schedule, fa2_forward, fa2_tile_update as library_update

pytestmark = pytest.mark.ex04
# what a learner's file may use of flashlib (the stub's imports); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers: calling one while graded is "not accepted" too, however it is
# reached (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.teach.tiled.fa2_tile_update", "flashlib.teach.tiled.fa2_forward",
                    "flashlib.teach.tiled.fa1_forward", "flashlib.teach.tiled.standard_attention",
                    "flashlib.teach.tiled.online_attention", "flashlib.reference.attention_ref")

DTYPES = (np.float32, np.float64)

HINT_NAN = ("a row whose scores are all -inf so far gives NaN: exp(-inf - (-inf)) is NaN. "
            "Where m_new is -inf use 0 as the reference max, so that alpha and P come out 0 "
            "and the row keeps m = -inf, l = 0, acc = 0")
HINT_RUNNING_MAX = ("m must be the running max, m_new = max(m_old, rowmax(scores)), not the "
                    "max of this block alone")


def _formulas(scores, v_block, m, l, acc):
    """The update in float64, guarding rows that are all -inf."""
    scores, v_block, m, l, acc = (np.asarray(t, np.float64) for t in (scores, v_block, m, l, acc))
    m_new = np.maximum(m, scores.max(axis=-1))
    ref = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m - ref)
    p = np.exp(scores - ref[..., None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + p @ v_block


def _call(impl, scores, v_block, m, l, acc):
    args = [t.copy() for t in (scores, v_block, m, l, acc)]
    result = checks.function(impl, "fa2_tile_update")(*args)
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        checks.fail(f"fa2_tile_update returned {type(result).__name__}; it should return the "
                    "triple (m, l, acc)")
    for name, before, after in zip(("scores", "v_block", "m", "l", "acc"),
                                   (scores, v_block, m, l, acc), args):
        if not np.array_equal(before, after):
            checks.fail(f"fa2_tile_update changed its argument {name} in place (e.g. acc *= "
                        "alpha): return new arrays instead; the caller may still need them")
    out = tuple(checks.as_array(t, name) for t, name in zip(result, ("m", "l", "acc")))
    for name, got, want in zip(("m", "l", "acc"), out, (m, l, acc)):
        if got.shape != want.shape:
            checks.fail(f"the new {name} has shape {got.shape}; expected {want.shape}, the "
                        f"shape of the {name} passed in")
        if got.dtype != want.dtype:
            checks.fail(f"the new {name} is {got.dtype} for {want.dtype} inputs: the docstring "
                        "promises the same dtype (no astype, no float64 constants)")
    return out


def _state(rng, dtype, lead=(2, 3), Bq=16, Bk=24, D=80):
    """A mid-loop state: some rows' running max above this block's max, some below."""
    scores = 2 * rng.standard_normal(lead + (Bq, Bk))
    v_block = rng.standard_normal(lead + (Bk, D))
    m = scores.max(axis=-1) + rng.uniform(-3, 3, lead + (Bq,))
    l = rng.uniform(0.5, 5, lead + (Bq,))
    acc = rng.standard_normal(lead + (Bq, D))
    return tuple(t.astype(dtype) for t in (scores, v_block, m, l, acc))


def _update_hint(state, got):
    """Which of m, l, acc is wrong, and the likely reason."""
    m, l, acc = got
    m_ref, l_ref, acc_ref = _formulas(*state)
    close = lambda a, b: np.allclose(a, b, rtol=1e-4, atol=1e-6)  # noqa: E731
    if np.isnan(m).any() or np.isnan(l).any() or np.isnan(acc).any():
        return HINT_NAN
    if not close(m, m_ref):
        return HINT_RUNNING_MAX
    if not close(l, l_ref):
        return ("l is wrong although m is right: did you rescale l by alpha = exp(m_old - m_new) "
                "before adding the row sums of P?")
    if close(acc, acc_ref / np.where(l_ref > 0, l_ref, 1.0)[..., None]):
        return ("your acc is divided by l: keep it unnormalised; fa2_forward divides by l once, "
                "after the last block (deferred normalisation, FA2's saving)")
    if not close(acc, acc_ref):
        return ("acc is wrong although m and l are right: did you rescale acc by "
                "alpha[..., None] before adding P @ v_block?")
    return None


def _masked_state(rng, dtype, D=80):
    """Rows 0-2 all -inf from the start; rows 3-5 with a state but an all -inf block."""
    scores, v_block, m, l, acc = _state(rng, np.float64, lead=(), Bq=8, Bk=12, D=D)
    scores[:6] = -np.inf
    scores[6, :5] = -np.inf                      # a partly masked row
    m[:3], l[:3], acc[:3] = -np.inf, 0.0, 0.0    # nothing seen yet
    return tuple(t.astype(dtype) for t in (scores, v_block, m, l, acc))


def _masked_hint(impl, rng, dtype=np.float64):
    state = _masked_state(rng, dtype)
    got = _call(impl, *state)
    if any(np.isnan(t).any() for t in got):
        return HINT_NAN
    return _update_hint(state, got)


def _diagnose(impl):
    rng = np.random.default_rng(5)
    state = _state(rng, np.float64)
    return _masked_hint(impl, rng) or _update_hint(state, _call(impl, *state))


def check_one_update(impl, rng):
    """one update matches the formulas (direct call, float32 and float64)"""
    for dtype in DTYPES:
        state = _state(rng, dtype)
        got = _call(impl, *state)
        expected = _formulas(*state)
        baseline = library_update(*state)
        for name, g, e, b in zip(("m", "l", "acc"), got, expected, baseline):
            checks.expect_close(g, e, baseline=b, dtype=np.dtype(dtype),
                                name=f"the new {name} ({dtype.__name__} scores of shape "
                                      f"{state[0].shape})",
                                hint=lambda: _update_hint(state, got))


def check_masked_rows(impl, rng):
    """rows with only -inf scores keep m = -inf, l = 0, acc = 0, without NaN"""
    for dtype in DTYPES:
        state = _masked_state(rng, dtype)
        got = _call(impl, *state)
        for name, g, e, b in zip(("m", "l", "acc"), got, _formulas(*state), library_update(*state)):
            if np.isnan(g).any():
                rows = sorted(set(np.argwhere(np.isnan(g))[:, 0].tolist()))
                checks.fail(f"the new {name} has NaN in rows {rows} (rows 0-5 of this block "
                            "have only -inf scores)", HINT_NAN)
            checks.expect_close(g, e, baseline=b, dtype=np.dtype(dtype),
                                name=f"the new {name} with fully masked rows",
                                hint=lambda: _update_hint(state, got))


HINT_EXPONENT = ("your update overflows where the maths does not: scores far from 0 (here "
                 "{where}) make exp(S) or exp(m) inf. Every exponent must be a difference that "
                 "is <= 0: alpha = exp(m_old - m_new), P = exp(S - m_new), never exp(S) / "
                 "exp(m_new) or exp(S) * exp(-m_new); and no floor such as -1e4 on the reference "
                 "max: scores can lie below -1e4 (only -inf means masked)")


def _extreme_state(rng, dtype, Bq=16, Bk=24, D=80):
    """Rows 0-3: scores ~2000 far above the running max; 4-7: the running max ~2000 above this
    block; 8-11: first block, scores ~ -3e4 (real scores below any -1e4 sentinel); 12-15: the
    same with a running state."""
    lead = (2, 3)
    scores = 2 * rng.standard_normal(lead + (Bq, Bk))
    offset = np.repeat([2000.0, 2000.0, -3e4, -3e4], 4)                  # (Bq,)
    scores = scores + offset[:, None]
    m = scores.max(axis=-1) + np.repeat([-150.0, 3.0, 0.0, 0.0], 4) + rng.uniform(-1, 1, lead + (Bq,))
    l = rng.uniform(0.5, 5, lead + (Bq,))
    acc = rng.standard_normal(lead + (Bq, D))
    m[..., 8:12], l[..., 8:12], acc[..., 8:12, :] = -np.inf, 0.0, 0.0
    v_block = rng.standard_normal(lead + (Bk, D))
    return tuple(t.astype(dtype) for t in (scores, v_block, m, l, acc))


def check_scores_far_from_zero(impl, rng):
    """scores in the thousands above and below 0 (past exp's range, below -1e4)"""
    for dtype in DTYPES:
        state = _extreme_state(rng, dtype)
        got = _call(impl, *state)
        where = "rows 0-7 near 2000, rows 8-15 near -30000"
        for name, g, e, b in zip(("m", "l", "acc"), got, _formulas(*state), library_update(*state)):
            checks.expect_close(g, e, baseline=b, dtype=np.dtype(dtype),
                                name=f"the new {name} ({dtype.__name__}, {where})",
                                hint=lambda: _diagnose(impl) or HINT_EXPONENT.format(where=where))


def _textbook(q, k, v, causal, scale=None, allowed=None):
    """Naive attention in the inputs' dtype, empty rows -> out 0, lse -inf. allowed: a mask
    (Nq, Nk) of the pairs that may attend, instead of causal's."""
    Nq, Nk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / np.sqrt(D) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)            # (B, H, Nq, Nk)
    if causal:
        allowed = np.arange(Nk) <= np.arange(Nq)[:, None] + Nk - Nq
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1)
    p = np.exp(s - np.where(np.isneginf(m), 0, m)[..., None])
    l = p.sum(axis=-1)
    out = (p @ v) / np.where(l > 0, l, 1)[..., None]
    return out, np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf)


def _expect_forward(impl, rng, dtype, shape_q, shape_k, block_q, block_k, causal):
    q = rng.standard_normal(shape_q).astype(dtype)
    k, v = (rng.standard_normal(shape_k).astype(dtype) for _ in range(2))
    fn = checks.function(impl, "fa2_tile_update")
    out, lse = fa2_forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal,
                           tile_update=fn)
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    out_b, lse_b = _textbook(q, k, v, causal)
    out_lib, lse_lib = fa2_forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    what = (f"fa2_forward with your update, {dtype.__name__} q {shape_q}, k and v {shape_k}, "
            f"block_q={block_q}, block_k={block_k}, causal={causal}")
    hint = lambda: _diagnose(impl) or "follow the update in the docstring"  # noqa: E731
    mags = attention_magnitudes(q, k, v, causal=causal)      # the rule's floor, from the inputs
    checks.expect_close(out, out_ref, baseline=(out_b, out_lib), dtype=np.dtype(dtype),
                        name=f"out of {what}", hint=hint, magnitude=mags["out"])
    checks.expect_close(lse, lse_ref, baseline=(lse_b, lse_lib), dtype=np.dtype(dtype),
                        name=f"lse of {what}", hint=hint, magnitude=mags["lse"])


def check_fa2_forward(impl, rng):
    """flashlib's fa2_forward around your fa2_tile_update matches attention_ref (any block sizes)"""
    for dtype in DTYPES:
        block_q, block_k = [(16, 32), (32, 48), (64, 64)][rng.integers(3)]
        _expect_forward(impl, rng, dtype, (2, 3, 97, 80), (2, 3, 130, 80), block_q, block_k,
                        causal=False)


def check_fa2_causal(impl, rng):
    """the same, causal: Nq > Nk (rows with no key: out = 0, lse = -inf) and Nq < Nk"""
    for dtype in DTYPES:
        _expect_forward(impl, rng, dtype, (1, 9, 130, 80), (1, 9, 97, 80), 32, 16, causal=True)
        _expect_forward(impl, rng, dtype, (1, 9, 17, 80), (1, 9, 130, 80), 16, 48, causal=True)


# ---- fa2_forward: the learner's whole forward ----------------------------------------------

HINT_EMPTY_ROWS = ("rows that see no key (causal with Nq > Nk: rows i < Nq - Nk) give NaN: "
                   "their l is 0, and acc / l is 0 / 0, log(l) is -inf. After the key loop, "
                   "divide by 1 where l is 0 (out stays 0) and set lse = -inf there")


def _call_forward(impl, q, k, v, **kwargs):
    args = [q.copy(), k.copy(), v.copy()]
    result = checks.function(impl, "fa2_forward")(*args, **kwargs)
    for name, before, after in zip("qkv", (q, k, v), args):
        if not np.array_equal(before, after):
            checks.fail(f"fa2_forward changed its argument {name} in place (e.g. q *= scale): "
                        "compute into new arrays; the caller may still need it")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        checks.fail(f"fa2_forward returned {type(result).__name__}; it should return the pair "
                    "(out, lse)")
    out, lse = (checks.as_array(t, name) for t, name in zip(result, ("out", "lse")))
    for name, got, want in (("out", out, q.shape), ("lse", lse, q.shape[:-1])):
        if got.shape != want:
            checks.fail(f"fa2_forward's {name} has shape {got.shape}; expected {want} for q of "
                        f"shape {q.shape}")
        if got.dtype != q.dtype:
            checks.fail(f"fa2_forward's {name} is {got.dtype} for {q.dtype} inputs: the "
                        "docstring promises q's dtype (no astype, no float64 constants)")
    return out, lse


def _probe(impl, Nq, Nk, block_q, block_k, causal, scale=None, seed=7):
    """A small float64 problem: (q, k, v, out, lse) with the learner's fa2_forward."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 2, n, 4)) for n in (Nq, Nk, Nk))
    kwargs = {} if scale is None else {"scale": scale}
    out, lse = _call_forward(impl, q, k, v, block_q=block_q, block_k=block_k, causal=causal,
                             **kwargs)
    return q, k, v, out, lse


def _same(out, lse, want):
    """(out, lse) equal to want = (out, lse) up to float64 rounding, -inf where it is -inf."""
    return np.allclose(out, want[0], rtol=1e-9, atol=1e-12) and \
        np.allclose(lse, want[1], rtol=1e-9, atol=1e-12)


def _forward_diagnose(impl):
    """Float64 probes; the first hint that fits, or None."""
    if _quietly(_diagnose, impl) is not None:
        return ("your fa2_tile_update is wrong (its checks above say how), and fa2_forward "
                "calls it: fix it first")
    q, k, v, out, lse = _probe(impl, 7, 11, 3, 4, causal=False)
    if not _same(out, lse, _textbook(q, k, v, False)):
        ref_out, ref_lse = _textbook(q, k, v, False)
        if _same(out[..., :6, :], lse[..., :6], (ref_out[..., :6, :], ref_lse[..., :6])):
            return ("with Nq = 7 and block_q = 3 your rows 6.. are wrong: the last query block is "
                    "shorter (1 row); loop over range(0, Nq, block_q) and store each block's "
                    "rows with the same slice q0:q0 + block_q")
        if _same(out, lse, _textbook(q, k[..., :8, :], v[..., :8, :], False)):
            return ("with Nk = 11 and block_k = 4 your forward leaves out keys 8-10, the last, "
                    "shorter key block: loop over range(0, Nk, block_k)")
        pad = [np.concatenate([t, np.zeros_like(t[..., :1, :])], axis=-2) for t in (k, v)]
        if _same(out, lse, _textbook(q, *pad, False)):
            return ("your forward counts a padded key (score 0) past Nk: a key position past "
                    "the end must be masked with -inf, or never loaded (slice k[..., j:j + "
                    "block_k, :] stops at Nk by itself)")
        if np.allclose(out, ref_out, rtol=1e-9):
            rowmax = (q @ np.swapaxes(k, -1, -2) / 2).max(axis=-1)
            if np.allclose(lse, ref_lse - rowmax, rtol=1e-9):
                return "lse is m + log(l), not log(l): l is a sum of exp(s - m)"
            return "lse = m + log(l) after the last key block, natural log"
        if np.allclose(out, _probe(impl, 7, 11, 3, 4, False, scale=1.0)[3], rtol=1e-9):
            return "your scores are not scaled: s = scale * q . k, with scale = 1/sqrt(D) when None"
        return ("out = acc / l once, after a query block's last key block; lse = m + log(l)")
    for Nq, Nk, block in ((7, 11, (3, 4)), (7, 8, (4, 4))):     # (7, 8): key 4 starts block 1
        q, k, v, out, lse = _probe(impl, Nq, Nk, *block, causal=True)
        i, j = np.arange(Nq)[:, None], np.arange(Nk)
        if _same(out, lse, _textbook(q, k, v, True)):
            continue
        if np.isnan(out).any() or np.isnan(lse).any():
            return HINT_EMPTY_ROWS
        if _same(out, lse, _textbook(q, k, v, False, allowed=j <= i)):
            return (f"your causal mask is top-left aligned (j <= i); here it is bottom-right: "
                    f"query i sees key j iff j <= i + Nk - Nq (with Nq = {Nq}, Nk = {Nk}, "
                    f"query 0 sees keys 0-{Nk - Nq})")
        if _same(out, lse, _textbook(q, k, v, False, allowed=j < i + Nk - Nq)):
            return ("your causal mask leaves out the diagonal: query i sees key j iff "
                    "j <= i + Nk - Nq, key i + Nk - Nq included")
        return (f"with Nq = {Nq}, Nk = {Nk}, block_q = {block[0]}, block_k = {block[1]} and "
                "causal=True some rows are wrong: a query block must visit every key block up "
                "to the one holding the last key its last row i sees, i + Nk - Nq, so "
                "range(0, i + Nk - Nq + 1, block_k); and mask within each tile (key j visible "
                "from query i iff j <= i + Nk - Nq)")
    q, k, v, out, lse = _probe(impl, 11, 5, 4, 2, causal=True)
    if np.isnan(out).any() or np.isnan(lse).any():
        return HINT_EMPTY_ROWS
    ref_out, ref_lse = _textbook(q, k, v, True)
    if not _same(out[..., 6:, :], lse[..., 6:], (ref_out[..., 6:, :], ref_lse[..., 6:])):
        return ("with Nq = 11, Nk = 5, block_q = 4, block_k = 2 and causal=True rows 6-10 are "
                "wrong: a query block must visit every key block up to the one holding key "
                "i + Nk - Nq of its last row i")
    if not _same(out, lse, (ref_out, ref_lse)):
        return HINT_EMPTY_ROWS
    return None


def _quietly(diagnose, *args):
    """A probe's hint, or None when the probe itself fails (a function missing or not done)."""
    try:
        return diagnose(*args)
    except Exception:
        return None


def _expect_fa2(impl, rng, dtype, shape_q, shape_k, block_q, block_k, causal, *, spread=1.0,
                scale=None, default_hint="follow lesson 04's FA2 table"):
    q = (spread * rng.standard_normal(shape_q)).astype(dtype)
    k, v = (rng.standard_normal(shape_k).astype(dtype) for _ in range(2))
    kwargs = {} if scale is None else {"scale": scale}
    out, lse = _call_forward(impl, q, k, v, block_q=block_q, block_k=block_k, causal=causal,
                             **kwargs)
    what = (f"your fa2_forward, {dtype.__name__} q {shape_q}, k and v {shape_k}, "
            f"block_q={block_q}, block_k={block_k}, causal={causal}"
            + ("" if scale is None else f", scale={scale}"))
    hint = lambda: _quietly(_forward_diagnose, impl) or default_hint  # noqa: E731
    if np.isnan(out).any() or np.isnan(lse).any():
        checks.fail(f"{what}: NaN in out or lse", hint())
    if causal and q.shape[-2] > k.shape[-2]:                 # rows i < Nq - Nk see no key
        empty = q.shape[-2] - k.shape[-2]
        if np.any(out[..., :empty, :] != 0) or np.any(lse[..., :empty] != -np.inf):
            checks.fail(f"{what}: rows 0-{empty - 1} see no key, and their out is not exactly 0 "
                        "or their lse not -inf", HINT_EMPTY_ROWS)
    four = (1,) * (4 - q.ndim)                               # attention_ref's (B, H, N, D)
    q4, k4, v4 = (t.reshape(four + t.shape) for t in (q, k, v))
    out_ref, lse_ref = (np.asarray(t).reshape(o.shape)
                        for t, o in zip(attention_ref(q4, k4, v4, causal=causal, scale=scale),
                                        (out, lse)))
    baselines = zip(_textbook(q, k, v, causal, scale),
                    fa2_forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal,
                                scale=scale))
    mags = attention_magnitudes(q4, k4, v4, causal=causal, scale=scale)
    for name, got, want, base in zip(("out", "lse"), (out, lse), (out_ref, lse_ref), baselines):
        checks.expect_close(got, want, baseline=base, dtype=np.dtype(dtype),
                            name=f"{name} of {what}", hint=hint, magnitude=mags[name])


def check_forward(impl, rng):
    """your fa2_forward: non-causal, Nq != Nk, blocks not dividing N, 2-D and 4-D inputs"""
    for dtype in DTYPES:
        block_q, block_k = [(16, 32), (32, 48), (64, 64), (128, 256)][rng.integers(4)]
        _expect_fa2(impl, rng, dtype, (2, 3, 97, 80), (2, 3, 130, 80), block_q, block_k, False)
        _expect_fa2(impl, rng, dtype, (17, 80), (1, 80), 8, 8, False)       # one key
        _expect_fa2(impl, rng, dtype, (1, 80), (33, 80), 16, 16, False, scale=0.3)


def check_forward_causal(impl, rng):
    """your fa2_forward, causal (bottom-right): Nq > Nk (rows with no key), Nq < Nk, Nk = Nq + 1"""
    for dtype in DTYPES:
        _expect_fa2(impl, rng, dtype, (1, 3, 130, 80), (1, 3, 97, 80), 32, 16, True,
                    default_hint=HINT_EMPTY_ROWS)
        _expect_fa2(impl, rng, dtype, (9, 17, 80), (9, 130, 80), 16, 48, True)
        # query block 0's last row sees key 16: the first key of key block 1
        _expect_fa2(impl, rng, dtype, (2, 2, 63, 32), (2, 2, 64, 32), 16, 16, True)


def check_forward_large_scores(impl, rng):
    """your fa2_forward with scores in the thousands (causal and not) stays finite and right"""
    for dtype in DTYPES:
        for causal in (False, True):
            _expect_fa2(impl, rng, dtype, (1, 3, 50, 64), (1, 3, 70, 64), 16, 32, causal,
                        spread=300.0, default_hint=HINT_EXPONENT.format(where="scores near +-3000"))


class _Tiles(checks.ReadRecorder):
    """q, k or v in HBM: a ReadRecorder over the rows (axis -2) whose reads also go, named, into
    one log shared by the three; np.empty_like and its kind read only the shape."""

    SHAPE_ONLY = (np.empty_like, np.zeros_like, np.ones_like, np.full_like)

    def __init__(self, array, name, log):
        super().__init__(array, axis=-2)
        self.reads = _Logged(name, log)

    def __array_function__(self, func, types, args, kwargs):
        if func in self.SHAPE_ONLY:
            bare = lambda t: t._a if isinstance(t, checks.ReadRecorder) else t  # noqa: E731
            return func(*map(bare, args), **{k: bare(v) for k, v in kwargs.items()})
        return super().__array_function__(func, types, args, kwargs)


class _Logged(list):
    def __init__(self, name, log):
        super().__init__()
        self.name, self.log = name, log

    def append(self, rows):
        super().append(rows)
        self.log.append((self.name, rows))


def _tile_problem(log, Nq, Nk, block_q, block_k):
    """What in ``log`` ([(name, rows read)], in order) is not FA2's causal walk, as (what, hint),
    or None: a read of more than a tile, a key read before any query tile, or a key tile read
    while the query rows last read all lie before it (no row sees any key in it: the tile is
    above the diagonal)."""
    most = {"q": block_q, "k": block_k, "v": block_k}
    rows_q = None
    for name, rows in log:
        if rows.size > most[name]:
            return (f"reads {rows.size} rows of {name} at once (a tile holds at most "
                    f"{most[name]})",
                    f"read {name}[..., a:b, :], a tile at a time, inside the loops: an operation "
                    f"on {name} itself ({name}.T, np.swapaxes({name}, ...), {name} * scale, "
                    f"np.asarray({name})) reads all of it, which a kernel cannot hold")
        if name == "q" or rows.size == 0:
            rows_q = rows if name == "q" and rows.size else rows_q
            continue
        if rows_q is None:
            return (f"reads {name}[{rows.min()}] before any query tile",
                    "the key loop runs inside the query loop: load a query tile, then its key "
                    "tiles")
        last = int(rows_q.max()) + Nk - Nq                   # the last key these rows see
        beyond = rows[rows // block_k * block_k > last]      # keys in tiles wholly past it
        if beyond.size:
            want = _tiles_computed(Nq, Nk, block_q, block_k)
            return (f"reads {name} rows {beyond.min()}-{beyond.max()} for query rows "
                    f"{rows_q.min()}-{rows_q.max()}, which see keys up to {last} only: a key "
                    "tile wholly past the diagonal",
                    f"FA2 computes {want} of the {-(-Nq // block_q) * -(-Nk // block_k)} tiles "
                    "here: a query block's key loop stops at the block holding key i + Nk - Nq "
                    "of its last row i; the tiles after it are never read, not computed and "
                    "then masked (all masked, they change nothing but cost as much as any "
                    "other tile)")
    return None


@checks.not_under_grade
def check_forward_skips_tiles(impl, rng):
    """your causal fa2_forward reads a tile at a time, never a key tile past the diagonal"""
    for Nq, Nk, block_q, block_k in ((100, 130, 16, 24), (90, 40, 16, 8)):
        q, k, v = (rng.standard_normal((2, n, 16)) for n in (Nq, Nk, Nk))
        log = []
        tiles = [_Tiles(t.copy(), name, log) for name, t in zip("qkv", (q, k, v))]
        checks.function(impl, "fa2_forward")(*tiles, block_q=block_q, block_k=block_k,
                                             causal=True)
        problem = _tile_problem(log, Nq, Nk, block_q, block_k)
        if problem is not None:
            checks.fail(f"with Nq = {Nq}, Nk = {Nk}, block_q = {block_q}, block_k = {block_k} "
                        f"and causal=True, your fa2_forward {problem[0]}", problem[1])
        _expect_fa2(impl, rng, np.float64, (2, Nq, 16), (2, Nk, 16), block_q, block_k, True)


def _tiles_computed(Nq, Nk, block_q, block_k):
    """How many tiles FA2 computes, causal: flashlib.teach.tiled's count."""
    return int(block_schedule(Nq, Nk, block_q=block_q, block_k=block_k, causal=True).sum())


CHECKS = [check_one_update, check_masked_rows, check_scores_far_from_zero, check_fa2_forward,
          check_fa2_causal, check_forward, check_forward_causal, check_forward_large_scores,
          check_forward_skips_tiles]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex04(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
