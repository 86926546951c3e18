"""Grader of exercise 13b (lesson 13): score modifiers softcap, temperature_alibi and chain, with
their derivatives.

Each modifier is called on copies of a tile of scores (float32 and float64; scores from 1e-3 to
1e4, both signs; heads given out of order and a subset of them; queries before and after keys,
Nq != Nk) and its value and derivative compared, element by element, with this grader's own
float64 formula and the derivative autograd takes of it; a wrong answer is matched against the
usual mistakes (the inner 1/cap, the square of tanh, a hard clamp, the temperature multiplied, the
bias's sign or absolute value, the head index, the chain factor) to name it. Then the learner's
softcap and temperature_alibi, alone and composed (by the grader: chain returns a function, which
cannot come back from ``flashlib grade``'s student process, so check_chain runs only under
``flashlib check`` and pytest), run inside ``flashlib.teach.score_mods.ModifiedAttention`` (a tiled
attention with the hook: the forward applies the values, the backward multiplies dS by the
derivatives), in float64, causal and not, and out, lse, dQ, dK and dV are compared with a dense
float64 attention over the grader's own formulas, differentiated by autograd.
"""
import functools
import math

import numpy as np
import pytest
import torch

from flashlib.course import checks, grading
from flashlib.teach.score_mods import ModifiedAttention

pytestmark = pytest.mark.ex13b
FLASHLIB_ALLOWED = ()
FLASHLIB_ANSWERS = ()

HINT_FINITE = ("the modifier must stay finite for scores in the thousands: use torch.tanh (which "
               "saturates at +-1) rather than exp(2x), which overflows")
HINT_INNER = "the cap divides inside the tanh as well as multiplying outside: cap * tanh(s / cap)"
HINT_VALUE = ("s_new = cap * tanh(s / cap), with torch.tanh: written through exp it loses digits "
              "near 0 (e - 1 cancels) and overflows for large scores")
HINT_CLAMP = ("a softcap is smooth: cap * tanh(s / cap), not a clamp to [-cap, cap] (a clamp's "
              "derivative is 0 past the cap and the gradient stops there)")
HINT_DERIV = ("return the derivative of the new score with respect to s as the second value: for "
              "a softcap d/ds cap tanh(s / cap) = 1 - tanh(s / cap)^2")
HINT_DERIV_ONE = ("the derivative is not 1: the backward multiplies dS by it, so with 1 the "
                  "gradient ignores the cap; for a softcap it is 1 - tanh(s / cap)^2")
HINT_DERIV_CAP = ("the derivative of cap * tanh(s / cap) is 1 - tanh(s / cap)^2: the outer cap and "
                  "the inner 1 / cap cancel, so do not divide by cap")
HINT_DERIV_SQUARE = "the derivative of tanh(x) is 1 - tanh(x)^2 (squared), not 1 - tanh(x)"
HINT_TEMPERATURE = ("a temperature divides the score: s / temperature[h] (a temperature above 1 "
                    "flattens the softmax), and the derivative of s / T is 1 / T")
HINT_TEMP_DERIV = ("the derivative of s / temperature[h] - bias with respect to s is "
                   "1 / temperature[h] (per head), not 1: the bias does not depend on s")
HINT_BIAS_SIGN = ("ALiBi subtracts its bias: - slopes[h] * |q_pos - k_pos|, so far keys get lower "
                  "scores")
HINT_ABS = ("the distance is |q_pos - k_pos| (absolute): a key after the query is as far as one "
            "before it")
HINT_HEAD = ("index the per-head parameters with the head argument: the tile's heads are head[0], "
             "head[1], ... (temperature[head], slopes[head]), not 0, 1, ... and not always head 0")
HINT_ORDER = ("the temperature divides the score only, then the bias is subtracted: "
              "s / temperature[h] - slopes[h] * |q_pos - k_pos|")
HINT_CHAIN_FACTOR = ("the derivative of second(first(s)) is second's derivative (at first's output) "
                     "times first's derivative: the chain rule multiplies, it does not drop a "
                     "factor or add them")
HINT_CHAIN_AT = ("evaluate second at first's output: s1, d1 = first(s, ...); s2, d2 = second(s1, "
                 "...); the derivative is d2 * d1, with d2 taken at s1, not at s")
HINT_CHAIN_ORDER = "chain(first, second) applies first, then second: second(first(s))"
HINT_ATTENTION = ("inside attention the forward uses your values and the backward multiplies dS by "
                  "your derivatives: check both (the checks above), and return them in s's shape "
                  "or one that broadcasts to it")


def _softcap64(s, cap):
    return cap * torch.tanh(s / cap)


def _temperature_alibi64(s, q_pos, k_pos, head, temperature, slopes):
    distance = (q_pos[:, None] - k_pos[None, :]).abs().double()
    return s / temperature[head][None, :, None, None] - slopes[head][None, :, None, None] * distance


def _value_and_grad(fn, s):
    """fn(s) in float64 and its elementwise derivative by autograd."""
    s = s.double().detach().requires_grad_()
    out = fn(s)
    (grad,) = torch.autograd.grad(out.sum(), s)
    return out.detach(), grad


def _call(impl, name, s, q_pos, k_pos, head, **params):
    """The learner's modifier on copies; checks it returned (s_new, derivative) of usable shapes."""
    fn = checks.function(impl, name)
    copies = [t.clone() for t in (s, q_pos, k_pos, head)]
    result = fn(*copies, **{k: v.clone() if isinstance(v, torch.Tensor) else v
                            for k, v in params.items()})
    return _pair(name, result, s)


def _pair(name, result, s):
    if not isinstance(result, (tuple, list)) or len(result) != 2 or \
            not all(isinstance(t, torch.Tensor) for t in result):
        checks.fail(f"{name} returned {type(result).__name__}; it should return the pair of tensors "
                    "(s_new, ds_new_ds)")
    value, deriv = result
    try:
        deriv = torch.broadcast_to(deriv, s.shape)
    except RuntimeError:
        checks.fail(f"{name}'s derivative has shape {tuple(deriv.shape)}, which does not broadcast "
                    f"to the scores' {tuple(s.shape)}", HINT_ATTENTION)
    if tuple(value.shape) != tuple(s.shape):
        checks.fail(f"{name} returned scores of shape {tuple(value.shape)}; expected "
                    f"{tuple(s.shape)}", HINT_ATTENTION)
    return value.double(), deriv.double()


def _close(got, want, dtype):
    """got within a few of dtype's ulps of want, elementwise (NaN and inf never close)."""
    eps = torch.finfo(dtype).eps
    return bool(torch.isfinite(got).all()) and \
        bool(((got - want).abs() <= 8 * eps * (1 + want.abs())).all())


def _first_wrong(got, want, dtype):
    bad = ~((got - want).abs() <= 8 * torch.finfo(dtype).eps * (1 + want.abs()))
    index = tuple(int(i) for i in bad.nonzero()[0]) if bad.any() else ()
    return index, (float(got[index]) if index else 0.0), (float(want[index]) if index else 0.0)


def _scores(rng, shape, dtype):
    """Scores of every size: tiny, ordinary, past any cap, in the thousands; both signs."""
    magnitude = 10.0 ** rng.uniform(-3, 4, shape)
    s = np.where(rng.random(shape) < 0.5, -1, 1) * magnitude
    s[..., 0, :2] = 1e4, -1e4                                 # the extremes, in every tile
    return torch.from_numpy(s).to(dtype)


def _positions(rng, bm, bn):
    """Query positions starting inside the keys' (bn >= 3): every tile has keys before and after
    some query, so a distance without its absolute value shows."""
    offset = int(rng.integers(1, bn - 1))
    return torch.arange(bm) + offset, torch.arange(bn)


def _report(name, what, got, want, s, hint):
    index, g, w = _first_wrong(got, want, s.dtype)
    checks.fail(f"{name}: the {what} differs at index {index} (score {float(s[index]):.6g}): got "
                f"{g:.9g}, expected {w:.9g}", hint)


def check_softcap(impl, rng):
    """softcap: value cap * tanh(s / cap) and derivative 1 - tanh^2, float32 and float64, scores
    from 1e-3 to 1e4 of both signs, caps of 50 (Gemma 2's) and random ones; always finite"""
    for dtype, cap in ((torch.float32, float(rng.uniform(2.0, 60.0))), (torch.float64, 50.0)):
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(3, 9)),
                 int(rng.integers(3, 9)))
        s = _scores(rng, shape, dtype)
        q_pos, k_pos = _positions(rng, shape[2], shape[3])
        head = torch.arange(shape[1])
        value, deriv = _call(impl, "softcap", s, q_pos, k_pos, head, cap=cap)
        want, want_d = _value_and_grad(lambda x: _softcap64(x, cap), s)
        if not (torch.isfinite(value).all() and torch.isfinite(deriv).all()):
            checks.fail(f"softcap (cap {cap:g}) returned inf or NaN for scores up to "
                        f"{float(s.abs().max()):.3g}", HINT_FINITE)
        if not _close(value, want, dtype):
            s64 = s.double()
            hint = (HINT_INNER if _close(value, cap * torch.tanh(s64), dtype) else
                    HINT_CLAMP if _close(value, s64.clamp(-cap, cap), dtype) else HINT_VALUE)
            _report(f"softcap (cap {cap:g}, {dtype})", "value", value, want, s, hint)
        if not _close(deriv, want_d, dtype):
            t = torch.tanh(s.double() / cap)
            hint = (HINT_DERIV_ONE if bool((deriv == 1).all()) else
                    HINT_DERIV_CAP if _close(deriv, want_d / cap, dtype) else
                    HINT_DERIV_SQUARE if _close(deriv, 1 - t, dtype) else HINT_DERIV)
            _report(f"softcap (cap {cap:g}, {dtype})", "derivative", deriv, want_d, s, hint)


def _alibi_case(rng, dtype, *, heads_given=None):
    H_all = int(rng.integers(3, 8))                         # 3 to 7 heads: not a power of two
    head = torch.arange(H_all) if heads_given is None else heads_given(H_all)
    shape = (int(rng.integers(1, 3)), len(head), int(rng.integers(2, 7)), int(rng.integers(3, 9)))
    s = torch.from_numpy(rng.normal(0.0, 3.0, shape)).to(dtype)
    q_pos, k_pos = _positions(rng, shape[2], shape[3])
    temperature = torch.from_numpy(rng.uniform(0.3, 3.0, H_all)).to(dtype)
    slopes = torch.from_numpy(rng.uniform(0.01, 1.0, H_all)).to(dtype)
    return s, q_pos, k_pos, head, temperature, slopes


def check_temperature_alibi(impl, rng):
    """temperature_alibi: s / temperature[h] - slopes[h] |q_pos - k_pos| and derivative
    1 / temperature[h]; 3 to 7 heads, the tile's heads given out of order and as a subset, queries
    before and after the keys, float32 and float64"""
    cases = [(torch.float64, None),
             (torch.float32, lambda H: torch.randperm(H)[:max(2, H - 2)]),
             (torch.float64, lambda H: torch.tensor([H - 1, 0]))]
    for dtype, heads_given in cases:
        s, q_pos, k_pos, head, temperature, slopes = _alibi_case(rng, dtype, heads_given=heads_given)
        value, deriv = _call(impl, "temperature_alibi", s, q_pos, k_pos, head,
                             temperature=temperature, slopes=slopes)
        t64, sl64 = temperature.double(), slopes.double()
        want, want_d = _value_and_grad(
            lambda x: _temperature_alibi64(x, q_pos, k_pos, head, t64, sl64), s)
        name = f"temperature_alibi (heads {head.tolist()} of {len(temperature)}, {dtype})"
        if not _close(value, want, dtype):
            s64, tt = s.double(), t64[head][None, :, None, None]
            sl = sl64[head][None, :, None, None]
            dist = (q_pos[:, None] - k_pos[None, :]).double()
            ordinal = torch.arange(len(head))
            guesses = ((HINT_TEMPERATURE, s64 * tt - sl * dist.abs()),
                       (HINT_BIAS_SIGN, s64 / tt + sl * dist.abs()),
                       (HINT_ABS, s64 / tt - sl * dist),
                       (HINT_ABS, s64 / tt + sl * dist),
                       (HINT_ORDER, (s64 - sl * dist.abs()) / tt),
                       (HINT_HEAD, _temperature_alibi64(s64, q_pos, k_pos, ordinal, t64, sl64)),
                       (HINT_HEAD, _temperature_alibi64(s64, q_pos, k_pos, ordinal * 0, t64, sl64)))
            hint = next((h for h, guess in guesses if _close(value, guess, dtype)), HINT_ORDER)
            _report(name, "value", value, want, s, hint)
        if not _close(deriv, want_d, dtype):
            hint = (HINT_TEMP_DERIV if bool((deriv == 1).all()) else
                    HINT_TEMPERATURE if _close(deriv, torch.broadcast_to(
                        t64[head][None, :, None, None], s.shape), dtype) else HINT_HEAD)
            _report(name, "derivative", deriv, want_d, s, hint)


def _cubic(s, q_pos, k_pos, head):
    """The grader's own first modifier: s + s^3 / 10 (its derivative 1 + 3 s^2 / 10)."""
    return s + s ** 3 / 10, 1 + 3 * s ** 2 / 10


def _wave(s, q_pos, k_pos, head):
    """The grader's own second modifier: sin(s) + s / 2 per head, shifted by the head number."""
    shift = head.to(s)[None, :, None, None]
    return torch.sin(s + shift) + s / 2, torch.cos(s + shift) + 0.5


@checks.not_under_grade
def check_chain(impl, rng):
    """chain(first, second): second(first(s)) and the chain rule's derivative d2(first(s)) * d1(s),
    for the grader's own two modifiers, in both orders"""
    fn = checks.function(impl, "chain")
    shape = (1, 3, int(rng.integers(3, 7)), int(rng.integers(3, 7)))
    s = torch.from_numpy(rng.normal(0.0, 1.5, shape))
    q_pos, k_pos = _positions(rng, shape[2], shape[3])
    head = torch.tensor([2, 0, 1])
    for first, second, f64, g64 in ((_cubic, _wave, lambda x: x + x ** 3 / 10,
                                     lambda x: torch.sin(x + head.double()[None, :, None, None]) + x / 2),
                                    (_wave, _cubic,
                                     lambda x: torch.sin(x + head.double()[None, :, None, None]) + x / 2,
                                     lambda x: x + x ** 3 / 10)):
        mod = fn(first, second)
        if not callable(mod):
            checks.fail(f"chain returned {type(mod).__name__}; it should return a function "
                        "mod(s, q_pos, k_pos, head) -> (s_new, ds_new_ds)")
        value, deriv = _pair("chain(first, second)", mod(s.clone(), q_pos, k_pos, head), s)
        want, want_d = _value_and_grad(lambda x: g64(f64(x)), s)
        name = f"chain({first.__name__.strip('_')}, {second.__name__.strip('_')})"
        if not _close(value, want, torch.float64):
            hint = HINT_CHAIN_ORDER if _close(value, f64(g64(s)), torch.float64) else HINT_CHAIN_AT
            _report(name, "value", value, want, s, hint)
        if not _close(deriv, want_d, torch.float64):
            _report(name, "derivative", deriv, want_d, s, HINT_CHAIN_AT if _close(
                deriv, second(s, q_pos, k_pos, head)[1] * first(s, q_pos, k_pos, head)[1],
                torch.float64) else HINT_CHAIN_FACTOR)


def _dense64(q, k, v, modify, causal):
    """The oracle: dense float64 attention with ``modify(s, q_pos, k_pos)`` on the scaled scores."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    q_pos, k_pos = torch.arange(Nq) + (Nk - Nq), torch.arange(Nk)
    s = modify(q @ k.transpose(-1, -2) / math.sqrt(D), q_pos, k_pos)             # (B, H, Nq, Nk)
    if causal:
        s = s.masked_fill(k_pos[None, :] > q_pos[:, None], -math.inf)
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def check_modifiers_in_attention(impl, rng):
    """your modifiers inside attention (flashlib.teach.score_mods.ModifiedAttention, float64):
    softcap alone and chain(softcap, temperature_alibi), causal and not, Nq != Nk, large scores;
    out, lse, dQ, dK, dV against dense float64 attention differentiated by autograd"""
    for causal in (False, True):
        B, H, Nq, Nk, D = 1, int(rng.integers(2, 6)), int(rng.integers(9, 30)), \
            int(rng.integers(30, 50)), 16
        q = torch.from_numpy(rng.normal(0.0, 6.0, (B, H, Nq, D)))               # scores past the cap
        k, v, dout = (torch.from_numpy(rng.standard_normal(s))
                      for s in ((B, H, Nk, D), (B, H, Nk, D), (B, H, Nq, D)))
        cap = float(rng.uniform(5.0, 50.0))
        temperature = torch.from_numpy(rng.uniform(0.5, 2.0, H))
        slopes = torch.from_numpy(rng.uniform(0.05, 0.5, H))
        cap_mod = functools.partial(checks.function(impl, "softcap"), cap=cap)
        bias_mod = functools.partial(checks.function(impl, "temperature_alibi"),
                                     temperature=temperature, slopes=slopes)

        def both(s, q_pos, k_pos, head):        # composed here: chain is checked on its own
            s1, d1 = _pair("softcap", cap_mod(s, q_pos, k_pos, head), s)
            s2, d2 = _pair("temperature_alibi", bias_mod(s1, q_pos, k_pos, head), s)
            return s2, d2 * d1
        heads = torch.arange(H)
        oracles = {
            "softcap": lambda s, qp, kp: _softcap64(s, cap),
            "chain(softcap, temperature_alibi)": lambda s, qp, kp: _temperature_alibi64(
                _softcap64(s, cap), qp, kp, heads, temperature, slopes)}
        for (name, modify), mod in zip(oracles.items(), (cap_mod, both)):
            where = f"{name}, {'causal, ' if causal else ''}Nq={Nq}, Nk={Nk}, {H} heads"
            mine = [t.clone().requires_grad_() for t in (q, k, v)]
            out, lse = ModifiedAttention.apply(*mine, mod, causal, None, 16)
            out.backward(dout)
            ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
            ref, ref_lse = _dense64(*ref_in, modify, causal)
            ref.backward(dout)
            for label, got, want in (("out", out, ref), ("lse", lse, ref_lse),
                                     *((f"d{x}", m.grad, r.grad)
                                       for x, m, r in zip("qkv", mine, ref_in))):
                err = float((got.detach() - want.detach()).abs().max())
                if not math.isfinite(err) or err > 1e-9 * (1 + float(want.detach().abs().max())):
                    checks.fail(f"{label} of attention with {where} differs from the float64 "
                                f"oracle by {err:.3g}", HINT_ATTENTION)


CHECKS = [check_softcap, check_temperature_alibi, check_chain, check_modifiers_in_attention]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex13b(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
