"""The one place that chooses the kernel version for a call, from one registry of numbered versions.

As in llm.c's ``dev/cuda/attention_forward.cu``, every dense kernel the course builds has a number
(``VERSIONS``): its forward launcher, its backward launcher if it has one, a ``supports``
predicate for each direction and a one-line description. ``forward`` and ``backward`` walk
``DISPATCH_ORDER`` and run the first version whose predicate takes the call:

    3  FlashAttention-3 (``fa3_fwd``, ``fa3_bwd``; paper section 3): on an sm90 GPU with Triton
       3.6's Gluon, float16/bfloat16, head dims 64 and 128, dense or packed, problems of at least
       ``fa3_from_flops`` FLOPs (below it FA2's autotuned kernels and shorter launches cost less);
       a score modifier in the forward only at ``fa3_fwd_mod_head_dims`` (the hook's work lands on
       its softmax warpgroups, its bound); the backward takes modifiers everywhere.
    2  FlashAttention-2 (``fa2_fwd``, ``fa2_bwd``): everything else, the CPU included.
    1  FlashAttention-1 (``fa1``, lesson 06): forward only, never dispatched; lessons call it by number.

What the predicates read comes from one ``runtime.KernelOptions`` per call (``fa3``,
``fa3_from_flops``, ``fa3_fwd_mod_head_dims``), resolved once by the public functions; the
backward gets the forward's. The choice is a few attribute reads and comparisons: it runs at
every call. The numbers behind the thresholds are in benchmarks/probes/NOTES.md.

Adding a version: a launcher pair with fa2's signatures, an entry in ``VERSIONS``, its number in
``DISPATCH_ORDER`` before the versions it should beat, and its check in tests/test_versions.py.
Limits: block-sparse attention and decoding have one kernel each and do not come through here.
"""
from typing import Callable, NamedTuple, Optional

from . import fa3_bwd, fa3_fwd
from .fa1 import fa1_forward
from .fa2_bwd import fa2_backward
from .fa2_fwd import fa2_forward
from .score_mod import identity


class Version(NamedTuple):
    """One numbered kernel version. forward: ``(q, k, v, *, causal, scale, score_mod, cu_seqlens,
    max_seqlen, options) -> (out, lse)`` (version 1: causal and scale only); backward: ``(q, k, v,
    out, lse, dout, *, same keywords) -> (dq, dk, dv)`` or None; supports: ``(q, k, v, causal,
    mod, cu_seqlens, max_seqlen, options) -> bool``, whether ``forward`` takes this call;
    supports_backward: the same with ``(q, k, v, out, lse, dout, ...)``."""
    number: int
    forward: Callable
    backward: Optional[Callable]
    supports: Callable
    supports_backward: Callable
    description: str


def attention_flops(B, H, Nq, Nk, D, *, causal=False):
    """Forward FLOPs: two matmuls, 4 B H Nq Nk D, halved for causal (the backward: 2.5x that)."""
    return 4 * B * H * Nq * Nk * D * (0.5 if causal else 1.0)


def fa3_large_enough(q, k, causal, max_seqlen, options) -> bool:
    """Whether FA3 is on and the problem reaches ``options.fa3_from_flops`` FLOPs executed
    (4 B Hq Nq Nk D, halved if causal; packed sequences counted at their longest key length)."""
    if not options.fa3:
        return False
    Nk = k.shape[-2] if max_seqlen is None else max_seqlen[1]
    return 4 * q.numel() * Nk >> bool(causal) >= options.fa3_from_flops   # q.numel(): B Hq Nq D


def fa3_supports(q, k, v, causal, mod, cu_seqlens, max_seqlen, options) -> bool:
    """Version 3's forward predicate (see the module docstring)."""
    return (fa3_large_enough(q, k, causal, max_seqlen, options)
            and fa3_fwd.supported(q, k, v, cu_seqlens is not None)
            and (mod.fn is identity or q.shape[-1] in options.fa3_fwd_mod_head_dims))


def fa3_supports_backward(q, k, v, out, lse, dout, causal, mod, cu_seqlens, max_seqlen, options) -> bool:
    """Version 3's backward predicate: large enough and runnable (``fa3_bwd.supported``),
    whichever version ran the forward (both give the same out and lse)."""
    return (fa3_large_enough(q, k, causal, max_seqlen, options)
            and fa3_bwd.supported(q, k, v, out, lse, dout, cu_seqlens is not None))


def always(*args) -> bool:
    """The predicate of a version that runs every call."""
    return True


def never(*args) -> bool:
    """The predicate of a version the dispatcher never picks (teaching versions)."""
    return False


VERSIONS = {
    1: Version(1, fa1_forward, None, never, never,
               "FA1 (Algorithm 1): grid (B*H,), KV blocks outer, O/l/m in HBM, re-read and re-written per tile"),
    2: Version(2, fa2_forward, fa2_backward, always, always,
               "FA2: grid (query blocks, B*H), Q blocks outer, state in registers, deferred normalisation"),
    3: Version(3, fa3_fwd.fa3_forward, fa3_bwd.fa3_backward, fa3_supports, fa3_supports_backward,
               "FA3 (Hopper, Gluon): TMA producer warp, 2 ping-pong consumer warpgroups, softmax under wgmma"),
}
DISPATCH_ORDER = (3, 2)   # tried in this order; the last must take every call


def forward_version(q, k, v, causal, mod, options, cu_seqlens=None, max_seqlen=None) -> Version:
    """The version whose forward runs this call (the first of ``DISPATCH_ORDER`` that takes it)."""
    for number in DISPATCH_ORDER:
        version = VERSIONS[number]
        if version.supports(q, k, v, causal, mod, cu_seqlens, max_seqlen, options):
            return version
    raise RuntimeError(f"no kernel version takes this call; DISPATCH_ORDER={DISPATCH_ORDER}")


def backward_version(q, k, v, out, lse, dout, causal, mod, options, cu_seqlens=None,
                     max_seqlen=None) -> Version:
    """The version whose backward runs this call."""
    for number in DISPATCH_ORDER:
        version = VERSIONS[number]
        if version.supports_backward(q, k, v, out, lse, dout, causal, mod, cu_seqlens, max_seqlen, options):
            return version
    raise RuntimeError(f"no kernel version takes this call; DISPATCH_ORDER={DISPATCH_ORDER}")


def forward(q, k, v, causal, scale, mod, options, cu_seqlens=None, max_seqlen=None):
    """Attention's forward by the chosen version: ``(out, lse)``. mod: a ``score_mod.ScoreMod``;
    options: a ``runtime.KernelOptions``; cu_seqlens, max_seqlen: packed sequences (fa2_forward's)."""
    version = forward_version(q, k, v, causal, mod, options, cu_seqlens, max_seqlen)
    return version.forward(q, k, v, causal=causal, scale=scale, score_mod=mod, cu_seqlens=cu_seqlens,
                           max_seqlen=max_seqlen, options=options)


def backward(q, k, v, out, lse, dout, causal, scale, mod, options, cu_seqlens=None, max_seqlen=None):
    """Attention's gradients by the chosen version: ``(dq, dk, dv)``; arguments as ``forward``'s."""
    version = backward_version(q, k, v, out, lse, dout, causal, mod, options, cu_seqlens, max_seqlen)
    return version.backward(q, k, v, out, lse, dout, causal=causal, scale=scale, score_mod=mod,
                            cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, options=options)
