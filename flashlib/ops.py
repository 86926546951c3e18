"""Public torch entry points: the autograd.Functions, ``flash_attention`` and ``block_sparse_attention``.

The layers follow flash-attention's Triton file: ``@triton.jit`` kernel (flashlib/kernels) ->
launcher (chosen by ``kernels/dispatch.py``: ``fa2_forward`` / ``fa2_backward``, FA3's on Hopper;
allocation, grid) -> ``FlashAttention`` (autograd.Function saving exactly q, k, v, out and lse) ->
``flash_attention`` (checks, keyword-only options, this docstring). Bad input raises
ValueError/TypeError naming the argument, before any kernel is compiled. Under torch.compile,
``flash_attention`` and ``block_sparse_attention`` reach the same launchers through torch operators
(two each) and ``OpAttention`` instead of the autograd.Functions (see ``_fa2_forward_op``). Each
public function takes ``kernel_options`` (a dict of ``runtime.KernelOptions`` fields, or one),
resolved once per call; the score modifiers travel as one ``score_mod.Modifiers``.
"""
from typing import Optional

import torch

from . import runtime
from .inputs import check_inputs, check_qkv, check_scale, check_score_mods, check_varlen
from .kernels import dispatch, fa3_fwd, score_mod
from .kernels.score_mod import Modifiers
from .masks import KernelView


class FlashAttention(torch.autograd.Function):
    """The forward and backward kernels as one autograd node (the versions ``kernels/dispatch.py``
    picks: FA2's, or FA3's on Hopper); saves q, k, v, out, lse (O(N) memory)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, mod, options, packed=None):
        # mod: a kernels.score_mod.ScoreMod; options: a runtime.KernelOptions (the backward's too);
        # packed: None, or varlen's ((cu_q, cu_k), (max_q, max_k))
        cu_seqlens, max_seqlen = packed or (None, None)
        out, lse = dispatch.forward(q, k, v, causal, scale, mod, options, cu_seqlens, max_seqlen)
        ctx.set_materialize_grads(False)   # lse's gradient: None, not a zeros tensor per call
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.mod, ctx.options, ctx.packed = causal, scale, mod, options, packed
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:   # out took no part in the loss
            return None, None, None, None, None, None, None, None
        cu_seqlens, max_seqlen = ctx.packed or (None, None)
        dq, dk, dv = dispatch.backward(q, k, v, out, lse, dout, ctx.causal, ctx.scale, ctx.mod,
                                       ctx.options, cu_seqlens, max_seqlen)
        return dq, dk, dv, None, None, None, None, None


# Under torch.compile, Dynamo cannot trace into the launchers (fast_launch's memo, a @triton.jit
# function passed as an argument: graph breaks that made a compiled model slower than eager), so
# the public functions run the same kernels behind torch operators instead (runtime.define_op),
# opaque to the compiler, which fuses the code around them and, with mode="reduce-overhead",
# captures them in CUDA graphs. Their gradient is OpAttention below, an autograd.Function that
# Dynamo traces: the forward op, then the backward op on the saved tensors. Outside compilation
# the autograd.Functions above cost less host time per call (no dispatcher in between).
# An op takes no objects: the score modifiers go in as Modifiers.op_args' two lists (mod_floats,
# mod_tensors) and the kernel options as KernelOptions.op_args' list of ints.
def _fa2_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                 mod_floats: list[float], mod_tensors: list[Optional[torch.Tensor]], options: list[int]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    mod = score_mod.make(q, Modifiers.from_op_args(mod_floats, mod_tensors))
    return dispatch.forward(q, k, v, causal, scale, mod, runtime.from_op_args(options))


def _fa2_forward_fake(q, k, v, causal, scale, mod_floats, mod_tensors, options):
    # as fa2_forward: out in q's memory layout (a transposed projection stays transposed)
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


def _fa2_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dout: torch.Tensor, causal: bool, scale: float,
                  mod_floats: list[float], mod_tensors: list[Optional[torch.Tensor]], options: list[int]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mod = score_mod.make(q, Modifiers.from_op_args(mod_floats, mod_tensors))
    return dispatch.backward(q, k, v, out, lse, dout, causal, scale, mod, runtime.from_op_args(options))


def _fake_grads(q, k, v, *args):
    """The backward ops' fake dq, dk, dv, as the launchers make them: empty_like of each input,
    made contiguous only if its last dim is strided."""
    return tuple(torch.empty_like(t if t.stride(-1) == 1 else t.contiguous()) for t in (q, k, v))


_fa2_forward_op = runtime.define_op("fa2_forward", _fa2_forward, _fa2_forward_fake)
_fa2_backward_op = runtime.define_op("fa2_backward", _fa2_backward, _fake_grads)


class OpAttention(torch.autograd.Function):
    """``FlashAttention`` under torch.compile, for each kind of call in ``OPS`` (dense, varlen,
    block_sparse): its forward op, then its backward op on the saved tensors. args: the ops'
    arguments after q, k, v (the backward's after q, k, v, out, lse, dout); the tensors among them
    (offsets, mask tables, ALiBi slopes) take no gradient."""

    @staticmethod
    def forward(ctx, kind, q, k, v, *args):
        out, lse = OPS[kind][0](q, k, v, *args)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kind, ctx.args = kind, args
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = OPS[ctx.kind][1](q, k, v, out, lse, dout, *ctx.args)
        return (None, dq, dk, dv, *(None for _ in ctx.args))


def flash_attention(q, k, v, *, causal=False, scale=None, softcap=None, alibi_slopes=None,
                    return_lse=False, q_descale=None, k_descale=None, v_descale=None,
                    kernel_options=None):
    """Exact attention with FlashAttention-2 kernels, differentiable through torch.autograd.

    q: (batch, heads_q, seqlen_q, headdim); k, v: (batch, heads_kv, seqlen_k, headdim) with
    heads_q % heads_kv == 0 (grouped-query attention when heads_kv < heads_q). Any seqlens,
    headdim up to 256, float16 / bfloat16 / float32 (float32 uses exact ``ieee`` dot products).
    CUDA tensors, or CPU tensors through Triton's interpreter on a machine without a GPU.

    causal: bottom-right aligned like flash-attn (query i sees key j iff j <= i + seqlen_k -
    seqlen_q), which is SDPA's ``is_causal`` only when seqlen_q == seqlen_k. For 2 queries, 4 keys::

        flashlib causal=True     SDPA is_causal=True
             x x x .                  x . . .
             x x x x                  x x . .

    scale: multiplies q k^T; defaults to 1/sqrt(headdim).
    softcap: a positive float (Gemma 2's logit softcap): scaled scores s become
    ``softcap * tanh(s / softcap)``. alibi_slopes: float32 (heads_q,) or (batch, heads_q): the
    bias ``-slope * |i + seqlen_k - seqlen_q - j|`` is added after the softcap, before the causal
    mask and the softmax (ALiBi). Both are differentiable in q, k, v; None: not applied.
    return_lse: also return lse (batch, heads_q, seqlen_q), float32, natural log.
    Returns out (like q) or (out, lse). A query row with no key to attend to gets out = 0 and
    lse = -inf.

    FP8 (FlashAttention-3's, on Hopper): float8_e4m3fn q, k, v with float32 ``q_descale``,
    ``k_descale``, ``v_descale`` of shape (batch, heads_kv) (x = x8 * descale, as
    ``flashlib.fp8.quantize`` makes them) run the FP8 forward and return bfloat16 out; forward
    only, no score modifiers; other GPUs get a clear error.

    kernel_options: a dict of ``flashlib.KernelOptions`` fields (``{"fa3": False}``) or a
    ``KernelOptions``, for this call (and its backward); None: those in force (the environment's,
    or a ``with flashlib.kernel_options(...)`` block's). An unknown name is a TypeError.
    """
    options = runtime.options(kernel_options)
    if (any(isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn for t in (q, k, v))
            or any(d is not None for d in (q_descale, k_descale, v_descale))):
        out, lse = _fp8_forward(q, k, v, causal, scale, Modifiers(softcap, alibi_slopes),
                                (q_descale, k_descale, v_descale), options)
        return (out, lse) if return_lse else out
    scale = check_inputs(q, k, v, scale=scale, causal=causal)
    mods = check_score_mods(q, softcap=softcap, alibi_slopes=alibi_slopes)
    if torch.compiler.is_compiling():
        out, lse = OpAttention.apply("dense", q, k, v, causal, scale, *mods.op_args(), options.op_args())
    else:
        out, lse = FlashAttention.apply(q, k, v, causal, scale, score_mod.make(q, mods), options)
    return (out, lse) if return_lse else out


def _fp8_forward(q, k, v, causal, scale, mods, descales, options):
    """flash_attention's FP8 path: checks, then kernels/fa3_fwd.fa3_forward_fp8. mods: the
    (unchecked) ``Modifiers``; descales: (q_descale, k_descale, v_descale)."""
    from . import fp8
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if any(t.dtype != torch.float8_e4m3fn for t in (q, k, v)):
        raise TypeError("q_descale, k_descale and v_descale go with float8_e4m3fn q, k and v; got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    D = check_qkv(q, k, v)[-1]
    descales = fp8.check_descales(q, k, v, *descales)
    if any(value is not None for value in mods):
        raise ValueError("softcap and alibi_slopes are not supported with FP8 inputs")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    scale = check_scale(scale, D)
    q, k = (t if fa3_fwd.tma_ok(t) else t.contiguous() for t in (q, k))
    if not fa3_fwd.supported_fp8(q, k, v):
        where = runtime.gpu_name() if q.device.type == "cuda" else f"a {q.device.type} tensor"
        raise RuntimeError(f"FP8 attention runs on a Hopper GPU (sm90) with Triton 3.6's Gluon, "
                           f"head dims {fa3_fwd.HEAD_DIMS}; got {where}, headdim {D}")
    return fa3_fwd.fa3_forward_fp8(q, k, v, descales, causal=causal, scale=scale, options=options)


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                           causal=False, scale=None, softcap=None, alibi_slopes=None,
                           return_lse=False, kernel_options=None):
    """``flash_attention`` over a batch of sequences of different lengths, packed without padding.

    q: (total_q, heads_q, headdim), k, v: (total_k, heads_kv, headdim): the sequences one after
    another (flash-attn's layout); sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q
    and [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v. cu_seqlens_*: int32 (batch + 1,) from 0,
    non-decreasing, ending at total_q / total_k; max_seqlen_*: ints at least the longest sequence
    (the kernels' grid). Sequences never see each other; ``causal`` is bottom-right within each
    one (query i of n_q sees key j of n_k iff j <= i + n_k - n_q). For two sequences of 3 and 2
    tokens, causal (x = attends)::

        x . . | . .
        x x . | . .
        x x x | . .
        ------+----
        . . . | x .
        . . . | x x

    scale, softcap: as ``flash_attention``; alibi_slopes: (heads_q,) or (batch, heads_q), the bias
    from positions within each sequence. Returns out (total_q, heads_q, headdim) or (out, lse) with
    lse (heads_q, total_q) float32, natural log; an empty sequence has no rows. Differentiable in
    q, k, v. On Hopper the kernels are FA3's (``kernels/dispatch.py``). The
    offsets are checked on the host (a device sync on a GPU, once per version of each offsets
    tensor: ``inputs.read_once``; under torch.compile a graph break before the kernels, which run
    as the ops ``flashlib::fa2_varlen_forward`` and ``flashlib::fa2_varlen_backward``).
    kernel_options: as ``flash_attention``'s.
    """
    options = runtime.options(kernel_options)
    scale = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         scale=scale, causal=causal)
    batch = cu_seqlens_q.numel() - 1
    mods = check_score_mods(q, softcap=softcap, alibi_slopes=alibi_slopes, batch=batch)
    if torch.compiler.is_compiling():
        out, lse = OpAttention.apply("varlen", q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                     int(max_seqlen_k), causal, scale, *mods.op_args(), options.op_args())
    else:
        packed = ((cu_seqlens_q, cu_seqlens_k), (int(max_seqlen_q), int(max_seqlen_k)))
        out, lse = FlashAttention.apply(q, k, v, causal, scale, score_mod.make(q, mods, batch=batch),
                                        options, packed)
    return (out, lse) if return_lse else out


# flash_attention_varlen under torch.compile: the same launchers as ops (see _fa2_forward_op).
# The offsets are checked on the host before tracing reaches the op (check_varlen reads them;
# under compilation that is a graph break before the op, not inside it).
def _varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                    scale: float, mod_floats: list[float], mod_tensors: list[Optional[torch.Tensor]],
                    options: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    mod = score_mod.make(q, Modifiers.from_op_args(mod_floats, mod_tensors), batch=cu_seqlens_q.numel() - 1)
    return dispatch.forward(q, k, v, causal, scale, mod, runtime.from_op_args(options),
                            (cu_seqlens_q, cu_seqlens_k), (max_seqlen_q, max_seqlen_k))


def _varlen_forward_fake(q, k, v, *args):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _varlen_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                     lse: torch.Tensor, dout: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                     causal: bool, scale: float, mod_floats: list[float],
                     mod_tensors: list[Optional[torch.Tensor]], options: list[int]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mod = score_mod.make(q, Modifiers.from_op_args(mod_floats, mod_tensors), batch=cu_seqlens_q.numel() - 1)
    return dispatch.backward(q, k, v, out, lse, dout, causal, scale, mod, runtime.from_op_args(options),
                             (cu_seqlens_q, cu_seqlens_k), (max_seqlen_q, max_seqlen_k))


_varlen_forward_op = runtime.define_op("fa2_varlen_forward", _varlen_forward, _varlen_forward_fake)
_varlen_backward_op = runtime.define_op("fa2_varlen_backward", _varlen_backward, _fake_grads)


class BlockSparseAttention(torch.autograd.Function):
    """Block-sparse forward and backward as one autograd node; saves q, k, v, out, lse."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, mod, options):   # mask: a masks.KernelView; mod: a ScoreMod
        from .kernels.block_sparse import block_sparse_forward
        out, lse = block_sparse_forward(q, k, v, mask, scale=scale, score_mod=mod, options=options)
        ctx.set_materialize_grads(False)   # lse's gradient: None, not a zeros tensor per call
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.scale, ctx.mod, ctx.options = mask, scale, mod, options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        from .kernels.block_sparse import block_sparse_backward
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:   # out took no part in the loss
            return None, None, None, None, None, None, None
        dq, dk, dv = block_sparse_backward(q, k, v, out, lse, dout, ctx.mask, scale=ctx.scale,
                                           score_mod=ctx.mod, options=ctx.options)
        return dq, dk, dv, None, None, None, None


def block_sparse_attention(q, k, v, block_mask, *, block_size=128, causal=False, scale=None,
                           softcap=None, alibi_slopes=None, return_lse=False, kernel_options=None):
    """Exact attention restricted to a block mask; blocks the mask leaves out are never loaded.

    q: (batch, heads_q, seqlen_q, headdim); k, v: (batch, heads_kv, seqlen_k, headdim), as
    ``flash_attention`` (grouped heads, any seqlens, headdim up to 256, float16/bfloat16/float32).
    block_mask: either a bool tensor (..., ceil(seqlen_q / block_size), ceil(seqlen_k / block_size))
    that broadcasts over (batch, heads): query i may attend key j iff
    ``block_mask[..., i // block_size, j // block_size]``; or a ``flashlib.masks.BlockMask`` (from
    ``flashlib.masks``: causal, sliding window, document, ...), whose element-wise rule is applied
    exactly inside the partial blocks (its own block size is used).
    causal: also apply the bottom-right causal rule (query i sees key j iff j <= i + seqlen_k -
    seqlen_q, as in ``flash_attention``). scale: defaults to 1/sqrt(headdim). softcap,
    alibi_slopes: score modifiers, as in ``flash_attention`` (ALiBi's distance is i + seqlen_k -
    seqlen_q - j whatever the mask). Returns out (like q) or (out, lse); a query with no key to
    attend to gets out = 0, lse = -inf.
    With an all-true mask this is ``flash_attention``. kernel_options: as ``flash_attention``'s.
    """
    options = runtime.options(kernel_options)
    scale = check_inputs(q, k, v, scale=scale, causal=causal)
    mods = check_score_mods(q, softcap=softcap, alibi_slopes=alibi_slopes)
    mask = _resolve_mask(q, k, block_mask, block_size, causal)
    view = mask.kernel_view()
    if torch.compiler.is_compiling():
        out, lse = OpAttention.apply("block_sparse", q, k, v, view.tables(), view.layout(), scale,
                                     *mods.op_args(), options.op_args())
    else:
        out, lse = BlockSparseAttention.apply(q, k, v, view, scale, score_mod.make(q, mods), options)
    return (out, lse) if return_lse else out


def _resolve_mask(q, k, block_mask, block_size, causal):
    """The BlockMask on q's device that ``block_sparse_attention`` runs, checked against q, k."""
    from . import masks
    B, Hq, Nq, _ = q.shape
    Nk = k.shape[2]
    if isinstance(block_mask, masks.BlockMask):
        if (block_mask.seqlen_q, block_mask.seqlen_k) != (Nq, Nk):
            raise ValueError(f"block_mask was built for seqlen_q={block_mask.seqlen_q}, "
                             f"seqlen_k={block_mask.seqlen_k}; q and k have {Nq} and {Nk}")
        mask = block_mask & masks.causal(Nq, Nk, block_size=block_mask.block_size,
                                         device=block_mask.device) if causal else block_mask
    else:
        if not isinstance(block_size, int) or block_size < 16 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
        if isinstance(block_mask, torch.Tensor) and block_mask.device != q.device:
            raise ValueError(f"block_mask is on {block_mask.device} but q is on {q.device}")
        mask = masks.from_block_tensor(block_mask, Nq, Nk, block_size=block_size, causal=causal)
    Bm, Hm = mask.batch_heads
    if Bm not in (1, B) or Hm not in (1, Hq):
        raise ValueError(f"block_mask covers (batch, heads) = ({Bm}, {Hm}), which does not broadcast "
                         f"over q's ({B}, {Hq}): use 1 or the full size in each")
    return mask.to(q.device)


# Under torch.compile, block-sparse attention runs as ops too (see _fa2_forward_op). An op
# takes tensors and numbers, not a BlockMask: the mask's KernelView goes in as its tables and its
# layout, and KernelView.from_args rebuilds it for the launchers.


def _bs_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: list[torch.Tensor],
                layout: list[int], scale: float, mod_floats: list[float],
                mod_tensors: list[Optional[torch.Tensor]], options: list[int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    from .kernels.block_sparse import block_sparse_forward
    mod = score_mod.make(q, Modifiers.from_op_args(mod_floats, mod_tensors))
    return block_sparse_forward(q, k, v, KernelView.from_args(tables, layout), scale=scale,
                                score_mod=mod, options=runtime.from_op_args(options))


def _bs_forward_fake(q, k, v, *args):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


def _bs_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, dout: torch.Tensor, tables: list[torch.Tensor],
                 layout: list[int], scale: float, mod_floats: list[float],
                 mod_tensors: list[Optional[torch.Tensor]], options: list[int]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .kernels.block_sparse import block_sparse_backward
    mod = score_mod.make(q, Modifiers.from_op_args(mod_floats, mod_tensors))
    return block_sparse_backward(q, k, v, out, lse, dout, KernelView.from_args(tables, layout),
                                 scale=scale, score_mod=mod, options=runtime.from_op_args(options))


_bs_forward_op = runtime.define_op("block_sparse_forward", _bs_forward, _bs_forward_fake)
_bs_backward_op = runtime.define_op("block_sparse_backward", _bs_backward, _fake_grads)
OPS = {"dense": (_fa2_forward_op, _fa2_backward_op), "varlen": (_varlen_forward_op, _varlen_backward_op),
       "block_sparse": (_bs_forward_op, _bs_backward_op)}   # OpAttention's kinds: (forward, backward)
