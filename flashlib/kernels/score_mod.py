"""The score-modifier hook: one ``@triton.jit`` function every kernel applies to its scaled scores.

FlexAttention's idea (He et al., "FlexAttention", 2024: a ``score_mod(score, b, h, q_idx, kv_idx)``
compiled into the kernel) in the shape of this library's kernels. Every attention kernel (the FA2
forward, both backward tiles, block-sparse and decode) computes a tile of scaled scores and then
calls ``SCORE_MOD``, a constexpr, before it masks them and takes the softmax:

    s, ds_dscore = SCORE_MOD(s, q_pos, k_pos, bh, args)

- ``s``: a tile of scores, already multiplied by ``scale * log2(e) * input_scale`` (the kernels
  work in base 2, see ``tile.py``; ``ScoreMod.input_scale`` is 1 except for the softcap, whose
  ``1 / c`` rides in the kernel's one multiply of the scores), (rows, cols) float32 in any
  orientation (the dK/dV tile is transposed);
- ``q_pos``, ``k_pos``: int32 positions that broadcast against ``s``, the query's on the key axis
  (query i of Nq is at ``i + Nk - Nq``: bottom-right aligned, so ``k_pos <= q_pos`` is the
  causal rule) and the key's;
- ``bh``: ``batch * heads_q + query head``, a scalar or a tensor that broadcasts against ``s``
  (decode puts several heads in one tile);
- ``args``: a float32 pointer to ``ARGS_PER_HEAD`` parameters per (batch, query head), row ``bh``,
  in base-2 units (what ``make`` stores);
- returns the modified scores and their derivative with respect to ``s``, which the backward
  multiplies into dS (the forward never uses it, and the compiler drops it). The identity returns
  1.0: multiplying by a constant 1 folds away, so the default costs nothing.

Modifiers here: Gemma 2's logit softcap ``c * tanh(s / c)`` and ALiBi's bias
``-slope * |q_pos - k_pos|`` (Press et al., 2022), added after the softcap. The public functions'
keywords (``softcap=``, ``alibi_slopes=``) travel inside flashlib as one ``Modifiers`` value:
checked once (``flashlib.inputs.check_score_mods``), made into a ``ScoreMod`` for the kernels
(``make``), and passed to torch's custom ops as two lists (``Modifiers.op_args``). Adding one
(README, "adding a score modifier"): a jit function below, a field of ``Modifiers`` and a column of
``args`` in ``make``, its check, the oracle's formula in ``flashlib.reference.modify_scores``, and
the keyword on the public functions.
"""
import math
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .. import runtime
from .tile import LOG2E

ARGS_PER_HEAD = tl.constexpr(2)  # per (batch, query head), base 2: softcap, alibi slope


@triton.jit
def identity(s, q_pos, k_pos, bh, args):
    """No modifier: the scores as they are."""
    return s, 1.0


@triton.jit
def softcap_tanh(y, APPROX: tl.constexpr):
    """tanh(y) of y = s / c, the scores already divided by the cap (``input_scale``: one multiply
    per score fewer than dividing here), from one exp2 and a division, exact at 0 and saturating
    to +-1 without overflow; APPROX: one instruction, PTX ``tanh.approx.f32`` (sm75+), relative
    error up to 2^-10.99, what flash-attn's softcap uses. Each of exp2, the division's reciprocal
    and tanh.approx is one instruction of the special-function unit, the softcapped forward's
    bound: one instruction (tanh.approx) beats two (exp2 and the reciprocal); the same work as
    polynomials and Newton steps on the FMA units issues more instructions per score and was
    slower still (benchmarks/probes/production_probe.py, NOTES.md)."""
    if APPROX:
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [y], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        e = tl.math.exp2(-2.8853900817779268 * tl.abs(y))     # exp(-2|y|); 2 * log2(e)
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(y < 0, -t, t)
    return t


@triton.jit
def softcap_cap(bh, args):
    """Row ``bh``'s cap c (base 2), column 0 of ``args``; also read by the Hopper forward, which
    multiplies it in with exp2's subtraction (``fa3_fwd._softmax_step``)."""
    return tl.load(args + bh * ARGS_PER_HEAD)


@triton.jit
def _softcap(y, cap, APPROX: tl.constexpr):
    """(c tanh(y), 1 - tanh^2(y)) of y = s / c (``softcap_tanh``)."""
    t = softcap_tanh(y, APPROX)
    return cap * t, 1.0 - t * t


@triton.jit
def tanh_softcap(s, q_pos, k_pos, bh, args):
    """Gemma 2's logit softcap, c * tanh(s / c), given s / c; d/ds = 1 - tanh^2. c in column 0."""
    return _softcap(s, softcap_cap(bh, args), False)


@triton.jit
def tanh_softcap_approx(s, q_pos, k_pos, bh, args):
    """The softcap with the GPU's one-instruction tanh: for bfloat16 inputs on a GPU, whose own
    rounding (2^-9) is four times that tanh's error. float16's (2^-11) is not: with it, small
    float16 cases failed the oracle's tolerance on an H100, so float16 and float32 take the exp2
    formula."""
    return _softcap(s, softcap_cap(bh, args), True)


@triton.jit
def alibi_slope(bh, args):
    """Row ``bh``'s ALiBi slope (base 2), column 1 of ``args``; also read by the Hopper forward,
    which splits the bias off the diagonal (``fa3_fwd._scores``)."""
    return tl.load(args + bh * ARGS_PER_HEAD + 1)


@triton.jit
def alibi_bias(s, q_pos, k_pos, bh, args):
    """ALiBi: s - slope * |q_pos - k_pos|; d/ds = 1. The slope in column 1. The distance stays an
    int tile until it is scaled (why not floats per row and column: benchmarks/probes/NOTES.md)."""
    slope = alibi_slope(bh, args)
    return s - slope * tl.abs(q_pos - k_pos).to(tl.float32), 1.0


@triton.jit
def tanh_softcap_alibi_bias(s, q_pos, k_pos, bh, args):
    """The softcap, then ALiBi's bias (Gemma-style capping of the raw logits, then the bias)."""
    capped, dcap = tanh_softcap(s, q_pos, k_pos, bh, args)
    biased, _ = alibi_bias(capped, q_pos, k_pos, bh, args)
    return biased, dcap


@triton.jit
def tanh_softcap_approx_alibi_bias(s, q_pos, k_pos, bh, args):
    """``tanh_softcap_alibi_bias`` with the one-instruction tanh (bfloat16 on a GPU)."""
    capped, dcap = tanh_softcap_approx(s, q_pos, k_pos, bh, args)
    biased, _ = alibi_bias(capped, q_pos, k_pos, bh, args)
    return biased, dcap


class Modifiers(NamedTuple):
    """The score modifiers of one call, as the public functions take them (None: not applied):
    the one value flashlib passes around in their place. Float fields and tensor fields are
    listed in ``FLOAT_FIELDS`` and ``TENSOR_FIELDS`` (the custom ops' order)."""
    softcap: Optional[float] = None
    alibi_slopes: Optional[torch.Tensor] = None

    def op_args(self):
        """``(floats, tensors)`` for a torch custom op, whose schema takes no objects: each float
        field (NaN when None) and each tensor field (None allowed), in field order."""
        floats = [math.nan if getattr(self, name) is None else getattr(self, name) for name in FLOAT_FIELDS]
        return floats, [getattr(self, name) for name in TENSOR_FIELDS]

    @classmethod
    def from_op_args(cls, floats, tensors) -> "Modifiers":
        """The inverse of ``op_args``."""
        values = {name: None if math.isnan(x) else x for name, x in zip(FLOAT_FIELDS, floats)}
        return cls(**values, **dict(zip(TENSOR_FIELDS, tensors)))


FLOAT_FIELDS = ("softcap",)
TENSOR_FIELDS = ("alibi_slopes",)
NO_MODIFIERS = Modifiers()


class ScoreMod(NamedTuple):
    """What a launcher passes to its kernel: the jit function and its per-head parameters, and
    a bound on the modified scores (|s| <= bound, base 2) where the modifier guarantees one (a
    softcap alone: its cap), which lets the forward drop the softmax's running max
    (``tile.tile_update_bounded``); and the factor the kernel's scores take before ``fn`` sees
    them (the softcap's 1 / c, base 2), which launchers fold into their scale (``kernel_args``)."""
    fn: object                      # one of the @triton.jit functions above
    args: Optional[torch.Tensor]    # (batch * heads_q, ARGS_PER_HEAD) float32, or None
    bound: Optional[float] = None   # base 2; None: unbounded (no modifier, or ALiBi's bias)
    input_scale: float = 1.0


IDENTITY = ScoreMod(identity, None)


def make(q, mods: Modifiers, *, batch=None) -> ScoreMod:
    """The ``ScoreMod`` of the public functions' modifiers ``mods`` for q (B, Hq, ...) (validated
    before, by ``flashlib.inputs.check_score_mods``): ``IDENTITY`` when there are none.
    batch: B when q is packed, (total, Hq, D)."""
    if mods is NO_MODIFIERS:
        return IDENTITY
    softcap, alibi_slopes = mods
    if softcap is None and alibi_slopes is None:
        return IDENTITY
    B, Hq = q.shape[0] if batch is None else batch, q.shape[1]
    args = torch.zeros(B, Hq, ARGS_PER_HEAD.value, dtype=torch.float32, device=q.device)
    if softcap is not None:
        args[..., 0] = softcap * LOG2E
    if alibi_slopes is not None:
        args[..., 1] = alibi_slopes.to(device=q.device, dtype=torch.float32) * LOG2E  # (Hq,) or (B, Hq)
    approx = runtime.approximate_tanh(q.dtype, q.device)   # see tanh_softcap_approx
    # the softcap's 1 / c rides in the kernels' scale: one multiply per score fewer
    # (benchmarks/probes/production_probe.py fold, NOTES.md)
    bound, input_scale = None, 1.0 if softcap is None else 1.0 / (softcap * LOG2E)
    if softcap is None:
        fn = alibi_bias
    elif alibi_slopes is None:
        fn, bound = (tanh_softcap_approx if approx else tanh_softcap), softcap * LOG2E
    else:
        fn = tanh_softcap_approx_alibi_bias if approx else tanh_softcap_alibi_bias
    return ScoreMod(fn, args.reshape(B * Hq, ARGS_PER_HEAD.value), bound, input_scale)


def kernel_args(mod: Optional[ScoreMod], placeholder: torch.Tensor):
    """``(args pointer, SCORE_MOD, input_scale)`` for a launch: the identity's args are never
    read, so any tensor (``placeholder``) stands in for them. The launcher multiplies its
    ``scale * log2(e)`` by input_scale, and keys its launch plans on it (a plan bakes the scale)."""
    mod = IDENTITY if mod is None else mod
    return (placeholder if mod.args is None else mod.args), mod.fn, mod.input_scale
