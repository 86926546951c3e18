"""Grader of exercise 11 (lesson 11): attend(q, k, v, cache=None), a GPT layer's attention for
training (no cache), prefill (an empty KVCache) and decoding (a KVCache holding earlier tokens).

Outputs are compared with attention_ref (float64, bottom-right causal) over every token a new
token may see, under flashlib.testing's tolerance rule (baseline: attention_naive in the same
dtype), through flashlib's kernels (the interpreter on a CPU). Shapes are irregular: 37, 20 and 1
tokens, head dims 24 and 16, groups of 1, 2, 3 and 4 query heads per K/V head (2 over 2, 4 over
2, 6 over 3, 3 over 1, 6 over 2, 4 over 1), float32 and float16.
After every call the cache must hold exactly the tokens appended so far (keys and values in
order, lengths moved by T). A ragged batch (3 sequences holding 0, 20 and 11 tokens, slots past
each length filled with noise) catches reading past a sequence's end, and a whole 2-layer GPT
sampled with the learner's attend must give the logits of the same model recomputing the whole
sequence. Probes name the mistake: not causal, attended before appending, prompt not cached,
values cached as keys, slots past the length read, top-left causal, new tokens attending only to
themselves, grouped heads repeated by hand. A decode step of 40 new tokens (more than the cache
held before it) catches a call taken for a prefill by its length, and
the gradients of the training path (dq, dk, dv against float64 autograd; not under ``flashlib
grade``, whose learner's code runs in another process) an attend that stops them.
"""
import pytest
import torch

from flashlib.course import checks, grading
from flashlib import runtime
from flashlib.decode import KVCache
from flashlib.teach.gpt import GPT, GPTConfig
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import attention_magnitudes

pytestmark = pytest.mark.ex11
# what a learner's file may use of flashlib (the stub's import, and the decode kernel the cache
# wraps), as imported and where defined; anything else is "not accepted: write it yourself"
# (flashlib.course.integrity.borrowed, foreign)
FLASHLIB_ALLOWED = ("flashlib.flash_attention", "flashlib.flash_decode", "flashlib.KVCache",
                    "flashlib.ops.flash_attention", "flashlib.decode.flash_decode",
                    "flashlib.decode.KVCache")
# flashlib's own answer: calling it while graded is "not accepted" too (flashlib.course.integrity.tripwire)
FLASHLIB_ANSWERS = ("flashlib.teach.gpt.attend",)

DEV = runtime.DEVICE

HINT_CAUSAL = ("token i may attend only to tokens j <= i: flash_attention(q, k, v, causal=True) "
               "(without causal=True every token also sees the ones after it)")
HINT_APPEND_FIRST = ("append the new tokens' k and v to the cache before attending: a token "
                     "attends to itself too, and cache.attend(q) reads only what the cache holds")
HINT_PROMPT = ("the prompt's keys and values must go into the cache during the prefill "
               "(cache.append(k, v)): the tokens sampled next attend to them")
HINT_KV = "cache.append(k, v): keys first, then values; the cache holds what you gave it"
HINT_ONCE = "append each call's k and v once: the cache's lengths grow by T per call"
HINT_SLOTS = ("attend only to each sequence's valid positions: cache.k and cache.v are buffers "
              "of max_len slots, and those past a sequence's length are not keys; cache.attend(q) "
              "reads cache.seqlens")
HINT_TOP_LEFT = ("the new tokens are the LAST positions of their sequence: causal masking is "
                 "bottom-right (new token i sees cached positions j <= i + L - T), as in "
                 "cache.attend and flash_attention; SDPA's is_causal is top-left (token 0 would see "
                 "only position 0)")
HINT_NEW_ONLY = ("the new tokens attend to every cached token, not only to each other: decode "
                 "with cache.attend(q). A prefill is a cache holding nothing at all "
                 "(max(cache.lengths) == 0)")
HINT_GQA = ("grouped-query heads: query head h uses K/V head h // (Hq // Hkv), for any group size "
            "(here 3 or 4 query heads per K/V head, not only 2); flash_attention and cache.attend "
            "take k and v with fewer heads as they are, so pass them unchanged (repeating k and v "
            "by a fixed factor is right for one group size only)")
HINT_SHAPE = "return the attention output, shaped like q: (B, Hq, T, D), in q's dtype"
HINT_GRAD = ("training needs gradients: with cache None, return flash_attention(q, k, v, "
             "causal=True) as it is (its backward is lesson 08's kernels, through autograd), "
             "with no torch.no_grad(), .detach() or KV cache on that path (flash_decode has no "
             "backward)")


def _randn(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(scale * rng.standard_normal(shape)).to(DEV, dtype)


def _qkv(rng, B, Hq, Hkv, T, D, dtype):
    return _randn(rng, (B, Hq, T, D), dtype), _randn(rng, (B, Hkv, T, D), dtype), \
        _randn(rng, (B, Hkv, T, D), dtype)


def _came_back(cache):
    """Under flashlib grade the learner's call ran on a copy of the cache in the student's
    process: its tensors (k, v, seqlens) came back, its host copy of the lengths did not."""
    if cache is not None:
        cache._lengths = cache.seqlens.tolist()


def _attend_of(impl):
    """The learner's attend as the GPT calls it, with the cache's lengths brought back."""
    fn = checks.function(impl, "attend")

    def attend(q, k, v, cache=None):
        out = fn(q, k, v, cache)
        _came_back(cache)
        return out
    return attend


def _call(impl, q, k, v, cache, what):
    """The learner's output for (q, k, v, cache), after checking shape, dtype and the inputs."""
    fn = checks.function(impl, "attend")
    before = [t.clone() for t in (q, k, v)]
    try:
        out = fn(q, k, v, cache)
    except ValueError as e:      # flashlib refusing heads the learner regrouped by hand
        if "heads" not in str(e):
            raise
        checks.fail(f"attend raised ValueError for {what}: {e}", HINT_GQA)
    _came_back(cache)
    if any(not torch.equal(a, b) for a, b in zip(before, (q, k, v))):
        checks.fail(f"attend changed q, k or v in place ({what}): the model still needs them")
    if not isinstance(out, torch.Tensor):
        checks.fail(f"attend returned {type(out).__name__} for {what}", HINT_SHAPE)
    if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype:
        checks.fail(f"attend returned {out.dtype} {tuple(out.shape)} for {what}; expected "
                    f"{q.dtype} {tuple(q.shape)}", HINT_SHAPE)
    if torch.isnan(out).any():
        checks.fail(f"attend returned NaN for {what}", HINT_SLOTS)
    return out


def _ref(q, keys, values):
    """Bottom-right causal attention of the new rows q (1, Hq, T, D) over one sequence's every
    visible key (1, Hkv, L, D): (float64 oracle, same-dtype baseline, magnitude)."""
    out, _ = attention_ref(q, keys, values, causal=True)
    mags = attention_magnitudes(q, keys, values, causal=True)
    return out, attention_naive(q, keys, values, causal=True), mags["out"]


def _close(a, b, tol=1e-3):
    a, b = a.double().cpu(), b.double().cpu()
    return a.shape == b.shape and bool(((a - b).abs() <= tol * (1 + b.abs())).all())


def _diagnose(out, q, keys, values, cached, b):
    """Which known mistake gives ``out`` (sequence b): the output of each, computed in float64."""
    T, L = q.shape[2], keys.shape[2]
    wrong = [(HINT_CAUSAL, attention_ref(q, keys, values)[0]),
             (HINT_NEW_ONLY, attention_ref(q, keys[:, :, L - T:], values[:, :, L - T:], causal=True)[0]),
             (HINT_TOP_LEFT, attention_ref(q, keys[:, :, :T], values[:, :, :T], causal=True)[0])]
    if L > T:
        wrong.append((HINT_APPEND_FIRST, attention_ref(q, keys[:, :, :L - T], values[:, :, :L - T])[0]))
    if cached is not None:   # the whole buffer, every slot a key
        wrong.append((HINT_SLOTS, attention_ref(q, cached.k[b:b + 1], cached.v[b:b + 1], causal=True)[0]))
        wrong.append((HINT_KV, attention_ref(q, keys, keys, causal=True)[0]))
    Hq, Hkv = q.shape[1], keys.shape[1]
    if Hq != Hkv:   # K/V heads repeated by a fixed factor (or tiled) before a grouped kernel
        for f in (2, 3, 4):
            if f != Hq // Hkv and Hq % (f * Hkv) == 0:
                for rep in (lambda t: t.repeat_interleave(f, 1), lambda t: t.repeat(1, f, 1, 1)):
                    wrong.append((HINT_GQA, attention_ref(q, rep(keys), rep(values),
                                                          causal=True)[0]))
        tiled = keys.repeat(1, Hq // Hkv, 1, 1), values.repeat(1, Hq // Hkv, 1, 1)
        wrong.append((HINT_GQA, attention_ref(q, *tiled, causal=True)[0]))
    for hint, candidate in wrong:
        if _close(out, candidate):
            return hint
    return None


def _expect(out, q, keys, values, dtype, what, cache=None, b=0):
    ref, naive, mag = _ref(q, keys, values)
    checks.expect_close(out.cpu(), ref.cpu(), baseline=naive.cpu(), dtype=dtype, name=f"output of {what}",
                        hint=lambda: _diagnose(out, q, keys, values, cache, b) or
                        "follow the docstring: append, then attend over everything cached",
                        magnitude=mag)


def _expect_cache(cache, keys, values, lengths, what):
    """The cache holds exactly ``keys``/``values`` per sequence (lists of (Hkv, L_b, D))."""
    got = cache.lengths
    if got != lengths:
        hint = HINT_PROMPT if all(n == 0 for n in got) else HINT_ONCE
        if any(g < n for g, n in zip(got, lengths)):
            hint = HINT_PROMPT if "prefill" in what else HINT_APPEND_FIRST
        checks.fail(f"after {what} the cache holds {got} tokens per sequence; expected {lengths}", hint)
    if cache.seqlens.tolist() != lengths:
        checks.fail(f"after {what} cache.seqlens is {cache.seqlens.tolist()}, its lengths {got}: "
                    "change the cache only through cache.append", HINT_ONCE)
    for b, (kb, vb) in enumerate(zip(keys, values)):
        L = kb.shape[1]
        if not torch.equal(cache.k[b, :, :L], kb):
            checks.fail(f"after {what} the cache's keys of sequence {b} are not the tokens' k in order",
                        HINT_KV if torch.equal(cache.k[b, :, :L], vb) else HINT_ONCE)
        if not torch.equal(cache.v[b, :, :L], vb):
            checks.fail(f"after {what} the cache's values of sequence {b} are not the tokens' v in order",
                        HINT_KV if torch.equal(cache.v[b, :, :L], kb) else HINT_ONCE)


# ---------------------------------------------------------------------------------------------
# the checks

def check_training(impl, rng):
    """training (no cache): 2 sequences of 37 tokens, 4 query heads over 2 K/V heads, head dim
    24; 20 tokens with 4 query heads over 1 K/V head and 2 over 2; a single token with 3 query
    heads over 1"""
    for T, Hq, Hkv in ((37, 4, 2), (20, 4, 1), (20, 2, 2), (1, 3, 1)):
        q, k, v = _qkv(rng, 2, Hq, Hkv, T, 24, torch.float32)
        what = f"training on float32 q {tuple(q.shape)}, k and v {tuple(k.shape)}"
        out = _call(impl, q, k, v, None, what)
        for b in range(2):
            _expect(out[b:b + 1], q[b:b + 1], k[b:b + 1], v[b:b + 1], torch.float32, what)


def check_prefill(impl, rng):
    """prefill: a 17-token prompt into an empty KVCache attends as in training (6 query heads over
    2 K/V heads), and the cache then holds exactly its keys and values"""
    B, Hq, Hkv, T, D = 2, 6, 2, 17, 24
    cache = KVCache(B, Hkv, 40, D, dtype=torch.float32, device=DEV)
    q, k, v = _qkv(rng, B, Hq, Hkv, T, D, torch.float32)
    what = f"the prefill of a {T}-token prompt (float32, {Hq} query heads over {Hkv} K/V heads)"
    out = _call(impl, q, k, v, cache, what)
    _expect_cache(cache, list(k), list(v), [T] * B, what)
    for b in range(B):
        _expect(out[b:b + 1], q[b:b + 1], k[b:b + 1], v[b:b + 1], torch.float32, what, cache, b)


def _decode_steps(impl, rng, cache, history, steps, Hq, dtype):
    """Run ``steps`` (tokens per call) through the learner's attend; check each output against
    the oracle over that sequence's every token so far, and the cache after each call."""
    keys, values = history
    B, Hkv, _, D = cache.k.shape
    for i, T in enumerate(steps):
        q, k, v = _qkv(rng, B, Hq, Hkv, T, D, dtype)
        lengths = [kb.shape[1] for kb in keys]
        what = (f"decode step {i + 1} ({T} new token{'s' if T > 1 else ''}, {dtype}, {Hq} query "
                f"heads over {Hkv} K/V heads, cached lengths {lengths})")
        out = _call(impl, q, k, v, cache, what)
        keys = [torch.cat([kb, k[b]], dim=1) for b, kb in enumerate(keys)]
        values = [torch.cat([vb, v[b]], dim=1) for b, vb in enumerate(values)]
        for b in range(B):
            _expect(out[b:b + 1], q[b:b + 1], keys[b][None], values[b][None], dtype, what, cache, b)
        _expect_cache(cache, keys, values, [kb.shape[1] for kb in keys], what)


def _filled_cache(rng, lengths, Hkv, max_len, D, dtype, noise):
    """A KVCache holding ``lengths`` earlier tokens per sequence; slots past them hold noise
    (or zeros, as a fresh cache)."""
    B = len(lengths)
    cache = KVCache(B, Hkv, max_len, D, dtype=dtype, device=DEV, lengths=lengths)
    if noise:
        cache.k.copy_(_randn(rng, cache.k.shape, dtype, 3.0))
        cache.v.copy_(_randn(rng, cache.v.shape, dtype, 3.0))
    keys = [_randn(rng, (Hkv, n, D), dtype) for n in lengths]
    values = [_randn(rng, (Hkv, n, D), dtype) for n in lengths]
    for b, n in enumerate(lengths):
        cache.k[b, :, :n], cache.v[b, :, :n] = keys[b], values[b]
    return cache, (keys, values)


def check_decode(impl, rng):
    """decode: three single tokens after a cached 17-token prompt, then 2 tokens at once
    (speculative decoding), each attending to every token before it and to itself; 4 query heads
    over 1 K/V head"""
    cache, history = _filled_cache(rng, [17, 17], 1, 40, 24, torch.float32, noise=False)
    _decode_steps(impl, rng, cache, history, [1, 1, 1, 2], 4, torch.float32)


def check_ragged(impl, rng):
    """a ragged batch: 3 sequences holding 0, 20 and 11 tokens (slots past each length hold
    noise) decode one token each, then two"""
    cache, history = _filled_cache(rng, [0, 20, 11], 2, 32, 24, torch.float32, noise=True)
    _decode_steps(impl, rng, cache, history, [1, 2], 4, torch.float32)


def check_float16(impl, rng):
    """float16: a 9-token prompt, then two single tokens, 6 query heads over 3 K/V heads, head
    dim 16"""
    B, Hq, Hkv, T, D = 2, 6, 3, 9, 16
    cache = KVCache(B, Hkv, 16, D, dtype=torch.float16, device=DEV)
    q, k, v = _qkv(rng, B, Hq, Hkv, T, D, torch.float16)
    what = f"the prefill of a {T}-token prompt (float16, {Hq} query heads over {Hkv} K/V heads)"
    out = _call(impl, q, k, v, cache, what)
    for b in range(B):
        _expect(out[b:b + 1], q[b:b + 1], k[b:b + 1], v[b:b + 1], torch.float16, what, cache, b)
    _expect_cache(cache, list(k), list(v), [T] * B, what)
    _decode_steps(impl, rng, cache, (list(k), list(v)), [1, 1], Hq, torch.float16)


def check_long_decode(impl, rng):
    """a decode step of 40 new tokens at once (a chunk of a long prompt, or many draft tokens:
    more than the cache held) after 3 and 25 cached tokens: a call with a cache holding tokens is
    a decode whatever T"""
    cache, history = _filled_cache(rng, [3, 25], 2, 72, 16, torch.float32, noise=True)
    _decode_steps(impl, rng, cache, history, [40], 4, torch.float32)


@checks.not_under_grade   # autograd needs the learner's function in this process
def check_gradients(impl, rng):
    """training: gradients flow through your attend (dq, dk, dv against float64 autograd;
    17 tokens, 2 query heads over 1 K/V head, head dim 16)"""
    q, k, v = (t.requires_grad_() for t in _qkv(rng, 1, 2, 1, 17, 16, torch.float32))
    dout = _randn(rng, q.shape, torch.float32)
    what = f"training on float32 q {tuple(q.shape)}, k and v {tuple(k.shape)}"
    out = _call(impl, q, k, v, None, what)
    if not out.requires_grad:
        checks.fail(f"the output of {what} carries no gradient (it does not require grad)",
                    HINT_GRAD)
    grads = torch.autograd.grad(out, (q, k, v), dout, allow_unused=True)
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attention_ref(*leaves64, causal=True)[0], leaves64, dout.double())
    leaves32 = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    naive = torch.autograd.grad(attention_naive(*leaves32, causal=True), leaves32, dout)
    mags = attention_magnitudes(q.detach(), k.detach(), v.detach(), dout, causal=True)
    for name, g, e, b in zip(("dq", "dk", "dv"), grads, ref, naive):
        if g is None:
            checks.fail(f"{name} of {what} is None: the output does not depend on "
                        f"{name[1]} through autograd", HINT_GRAD)
        checks.expect_close(g.detach().cpu(), e.cpu(), baseline=b.cpu(), dtype=torch.float32,
                            name=f"{name} of {what}", hint=HINT_GRAD, magnitude=mags[name])


def _attention64(q, k, v, cache=None):
    """The oracle's attention for a model without a cache (float64, causal)."""
    return attention_ref(q, k, v, causal=True)[0].to(q.dtype)


def check_model(impl, rng):
    """a GPT sampling with your attend (an 8-token prefill, then 2 tokens one at a time): its
    logits equal the same model's recomputing the whole sequence"""
    cfg = GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=4, n_kv_head=2, n_embd=32)
    torch.manual_seed(int(rng.integers(1 << 31)))
    learner = GPT(cfg, attention=_attend_of(impl)).to(DEV)
    oracle = GPT(cfg, attention=_attention64).to(DEV, torch.float64)
    naive = GPT(cfg, attention=lambda q, k, v, cache=None: attention_naive(q, k, v, causal=True)).to(DEV)
    for model in (oracle, naive):
        model.load_state_dict(learner.state_dict())
    idx = torch.from_numpy(rng.integers(0, cfg.vocab_size, (2, 10))).to(DEV)
    caches = learner.new_caches(2, 12)
    with torch.no_grad():
        for start, stop in ((0, 8), (8, 9), (9, 10)):
            logits, _ = learner(idx[:, start:stop], caches=caches)
            what = (f"the model's logits for tokens {start}..{stop - 1} "
                    f"({'prefill' if start == 0 else 'decode'}, float32)")
            ref = oracle(idx[:, :stop])[0][:, start:stop]
            base = naive(idx[:, :stop])[0][:, start:stop]
            checks.expect_close(logits.cpu(), ref.cpu(), baseline=base.cpu(), dtype=torch.float32,
                                name=what, hint="the checks above test attend alone: run them first")


CHECKS = [check_training, check_prefill, check_decode, check_ragged, check_float16,
          check_long_decode, check_gradients, check_model]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex11(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
