"""The model suite's checks: nothing is timed before it has been checked against float64.

``flashlib.bench.model`` times whole models; these say, before any timing, whether what is about
to be timed computes the right thing, in the words of ``flashlib.testing``'s one tolerance rule
(at most twice a simple implementation's error against the float64 oracle, or the dtype's floor):

- ``check_attention``: one layer's attention at the timed shape (first sequence, two query heads
  or one K/V head with its group), output and dq, dk, dv, against ``attention_ref``; the baseline
  ``attention_naive`` in the same dtype, the floor from ``attention_magnitudes``;
- ``check_model``: the models' logits (first sequence, last 128 positions) and loss against the
  same weights in float64 with ``attention_ref``; SDPA's model is the baseline;
- ``check_decode``: the logits after a cached prefill and a few cached one-token steps against
  the float64 model recomputing the whole sequence; SDPA's cached decode is the baseline.

Each returns None or a sentence per implementation; ``failure`` words an exception the same way.
Limits: the model checks see a model in autocast or in its weights' dtype, not its gradients
(the attention check covers those); at random initialisation a loss is about ln(vocab) whatever
attention does, so the loss check is weak and the logits and attention checks carry the weight.
"""
import contextlib

import torch

from .. import runtime
from ..reference import attention_naive, attention_ref
from ..testing import attention_magnitudes, max_error, tolerance
from . import harness


def failure(e):
    return f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"


def autocast(dtype):
    """bfloat16/float16 autocast on a GPU; float32 (the interpreter's) runs as it is."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(runtime.DEVICE.type, dtype=dtype)


def oracle_attend(q, k, v, cache=None):
    """The float64 oracle models' attention: attention_ref, causal, recomputing (no cache)."""
    return attention_ref(q, k, v, causal=True)[0]


def check_attention(attend, Hq, Hkv, D, B, T, dtype):
    """None if ``attend(q, k, v)`` (causal) at (B, Hq/Hkv, T, D) is within the tolerance rule of
    attention_ref, forward and gradients; else what is wrong."""
    fn = lambda q, k, v, causal: attend(q, k, v)              # noqa: E731  (always causal)
    q, k, v = harness.make_inputs(B, Hq, Hkv, T, T, D, dtype, runtime.DEVICE)
    err, ok = harness.check(fn, q, k, v, True)
    if not ok:
        return f"wrong attention output: max error {err:.3g} over tolerance"
    hkv = 1 if Hq > Hkv else 2                  # one K/V head with its query heads, or two heads
    qs, ks, vs = q[:1, :hkv * Hq // Hkv], k[:1, :hkv], v[:1, :hkv]
    dout = torch.randn_like(qs)
    mine, ref, naive = ([t.detach().clone().requires_grad_() for t in (qs, ks, vs)] for _ in range(3))
    ref = [t.detach().double().requires_grad_() for t in ref]
    grads = [torch.autograd.grad(out, leaves, dout.to(out.dtype)) for out, leaves in (
        (fn(*mine, True), mine), (attention_ref(*ref, causal=True)[0], ref),
        (attention_naive(*naive, causal=True), naive))]
    mags = attention_magnitudes(qs, ks, vs, dout, causal=True)
    for name, g, r, b in zip(("dq", "dk", "dv"), *grads):
        err, tol = max_error(g, r), tolerance(r, b, dtype, magnitude=mags[name])
        if not err <= tol:
            return f"wrong attention {name}: max error {err:.3g} over tolerance {tol:.3g}"
    return None


def check_model(models, oracle, idx, targets, dtype):
    """({impl: None or what is wrong}, float64 loss, SDPA's loss): each model's logits and loss on
    idx, targets (B, T) against ``oracle``'s (the same weights in float64), under autocast(dtype)."""
    with torch.no_grad():
        logits, loss = oracle(idx, targets)
        ref = logits[:1, -128:], loss                                   # (1, 128, vocab), ()
        del logits
        got, notes = {}, {}
        for impl, m in models.items():
            try:
                with autocast(dtype):
                    logits, loss = m(idx, targets)
                got[impl] = logits[:1, -128:].float(), loss
            except Exception as e:
                notes[impl] = f"model check {failure(e)}"
    base = got["sdpa_default"]
    for impl, (logits, loss) in got.items():
        bad = [f"{what}: error {max_error(mine, r):.3g} over tolerance {tolerance(r, b, dtype):.3g}"
               for what, mine, r, b in (("logits", logits, ref[0], base[0]), ("loss", loss, ref[1], base[1]))
               if not max_error(mine, r) <= tolerance(r, b, dtype)]
        notes[impl] = "wrong " + "; ".join(bad) if bad else None
    return notes, ref[1], base[1]


def check_decode(models, oracle, prompt, extra, dtype):
    """{impl: None or what is wrong}: each GPT's logits after a cached prefill of prompt (B, T0)
    and one cached step per token of extra (B, n), against ``oracle`` recomputing the sequence."""
    B, T0 = prompt.shape
    with torch.no_grad():
        ref = oracle(torch.cat([prompt, extra], dim=1))[0][:, -1]      # (B, vocab)
        got = {}
        for impl, m in models.items():
            caches = m.new_caches(B, T0 + extra.shape[1])
            m(prompt, caches=caches)
            for i in range(extra.shape[1]):
                logits, _ = m(extra[:, i:i + 1], caches=caches)        # (B, 1, vocab)
            got[impl] = logits[:, -1].float()
    tol = tolerance(ref, got["sdpa_default"], dtype)
    return {impl: None if max_error(out, ref) <= tol else
            f"wrong decode logits: error {max_error(out, ref):.3g} over tolerance {tol:.3g}"
            for impl, out in got.items()}
