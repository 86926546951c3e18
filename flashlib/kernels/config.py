"""Block configs: autotuned on a GPU, one fixed config otherwise, always sized to fit SRAM.

Autotuning compiles and times every config once per key (problem size bucket, head dim, causal,
precision), so it runs only on a GPU with ``runtime.AUTOTUNE``, and only for problems of at least
``TUNE_FROM_SCORES`` scores; otherwise (and with FLASHLIB_AUTOTUNE=0) kernels take the first config
that fits. Through the interpreter (no GPU) kernels use 64x64 blocks: the interpreter's
cost is per program per loop step, whatever the tile size.

Shared memory: a kernel keeps ``resident`` rows of headdim (e.g. its Q block) and pipelines
``streamed`` rows per stage (e.g. a K and a V block), so it needs about
``elem_bytes * BLOCK_D * (resident + num_stages * streamed)`` bytes (this matches what Triton
reports); configs over the GPU's per-block limit are dropped before compiling.
"""
import functools
from typing import NamedTuple, Optional

import torch
import triton

from .. import runtime
from ..inputs import resolve_scale

INTERPRETER_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64}
KEY = ["n_bucket", "BLOCK_D", "CAUSAL", "DOT_PRECISION"]
# Problems with fewer scores (batch x heads x seqlen_q x seqlen_k) are not autotuned: their kernels
# take microseconds, less than the host's time per call, and tuning them compiled every config
# for each new shape (lesson 11's sampling and gradient check: minutes on an H200).
TUNE_FROM_SCORES = 1 << 24


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1). Launchers call this at every launch, and
    ``triton.next_power_of_2`` (a constexpr function since Triton 3.6) costs 1-2 us of host time."""
    return 1 << max(n - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints (``triton.cdiv``'s value, without its per-call cost)."""
    return -(-a // b)


def padded_headdim(D: int) -> int:
    """The kernels' BLOCK_D: the head dim padded to a power of two, at least 16 (``tl.dot``'s
    minimum); the padding is masked."""
    return max(16, next_power_of_2(D))


def size_bucket(*lengths, slices=1) -> int:
    """Autotuning key for a problem's size: the next powers of two (capped) of the longest sequence
    and of the (batch, head) slices, packed in one int. Both move the best tile: on an H200 the
    config tuned on 2 heads of a 16k block-sparse problem (small query blocks, to fill the GPU)
    took 0.73-0.75 ms on 64 heads, the one tuned there 0.64 ms; a first call on a slice must not
    decide for the whole."""
    length = min(next_power_of_2(max(lengths)), 1 << 16)
    return length * 2048 + min(next_power_of_2(slices), 1024)


@functools.cache
def _smem_limit() -> int:
    """Shared memory one program may use (read once: the driver query costs microseconds and
    ``choose`` runs at every launch)."""
    props = torch.cuda.get_device_properties(0)
    return getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024


def tuned(kernel, configs, footprint, elem_arg="Q", key=KEY):
    """Wrap ``kernel`` for launching; return ``choose(block_d, elem_bytes, scores, max_block=None)
    -> (launchable, launch kwargs)``: ``triton.autotune(kernel)`` and {} when autotuning, else
    ``kernel`` and the first config that fits.

    configs: (BLOCK_M, BLOCK_N, num_warps, num_stages) tuples, best guess first.
    footprint(BLOCK_M, BLOCK_N) -> (resident_rows, streamed_rows_per_stage), see module docstring.
    scores: the problem's size, batch x heads_q x seqlen_q x seqlen_k; under ``TUNE_FROM_SCORES``
    the first config is used even when autotuning. Blocks above ``max_block`` are dropped
    (block-sparse tiles must fit inside one mask block; there the kernel's SPARSE_BLOCK argument
    sets the limit when autotuning).
    """
    def fits(cfg, block_d, elem_bytes, max_block):
        bm, bn, _, stages = cfg
        resident, streamed = footprint(bm, bn)
        small = max_block is None or max(bm, bn) <= max_block
        return small and elem_bytes * block_d * (resident + stages * streamed) <= _smem_limit()

    @functools.cache
    def first_fitting(block_d, elem_bytes, max_block):
        if runtime.INTERPRET:
            return {k: min(v, max_block or v) for k, v in INTERPRETER_CONFIG.items()}
        fitting = [c for c in configs if fits(c, block_d, elem_bytes, max_block)]
        bm, bn, warps, stages = fitting[0] if fitting else (16, 16, 4, 1)
        return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)

    if not runtime.AUTOTUNE:
        return lambda block_d, elem_bytes, scores, max_block=None: (
            kernel, first_fitting(block_d, elem_bytes, max_block))

    def prune(triton_configs, named_args, **kwargs):
        block_d = named_args.get("BLOCK_D", kwargs.get("BLOCK_D"))
        max_block = named_args.get("SPARSE_BLOCK", kwargs.get("SPARSE_BLOCK"))
        elem_bytes = named_args[elem_arg].element_size()
        keep = [c for c in triton_configs if fits((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                                                   c.num_stages), block_d, elem_bytes, max_block)]
        return keep or [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]

    triton_configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                      for bm, bn, w, s in configs]
    autotuner = triton.autotune(triton_configs, key=key, prune_configs_by={"early_config_prune": prune})(kernel)

    def choose(block_d, elem_bytes, scores, max_block=None):
        if scores < TUNE_FROM_SCORES:
            return kernel, first_fitting(block_d, elem_bytes, max_block)
        return autotuner, {}
    return choose


def prologue(q, *tensors, scale=None, allow_tf32=False):
    """What every launcher does first. Returns ``(q, *tensors), scale, precision, dtype``.

    The tensors with their last dim contiguous (kernels step along a row by 1 and take every
    other stride as given); through the interpreter, bfloat16 as float32, since its bfloat16
    dots are wrong (``dtype`` is the caller's, to cast results back to); ``scale`` resolved
    (1/sqrt(headdim) by default); ``precision`` the dots' ("tf32" if ``allow_tf32``, else exact
    "ieee"). Inputs are validated before, by ``flashlib.inputs``.
    """
    dtype = q.dtype
    tensors = [t if t.stride(-1) == 1 else t.contiguous() for t in (q, *tensors)]
    if runtime.INTERPRET and dtype == torch.bfloat16:
        tensors = [t.float() for t in tensors]
    scale = resolve_scale(scale, q.shape[-1])
    return tensors, scale, "tf32" if allow_tf32 else "ieee", dtype


class Dims(NamedTuple):
    """A launch's sizes and layout, dense (B, H, N, D) or packed (flash-attn's varlen layout)."""
    sizes: tuple             # (B, Hq, Hkv, Nq, Nk, D); packed: B sequences, Nq, Nk the longest
    cu_q: Optional[torch.Tensor]   # packed: int32 (B + 1,) row offsets; dense: None
    cu_k: Optional[torch.Tensor]
    total_q: int             # packed: rows of q (lse is (Hq, total_q)); dense: 0

    @property
    def lse_shape(self):
        B, Hq, _, Nq, _, _ = self.sizes
        return (B, Hq, Nq) if self.cu_q is None else (Hq, self.total_q)

    def strides(self, t):
        """The kernels' (batch, head, row) strides of q, k, v, out or a gradient: packed tensors
        (rows, heads, D) have no batch stride (the rows' offsets say where each sequence is)."""
        return t.stride()[:3] if self.cu_q is None else (0, t.stride(1), t.stride(0))

    def offsets(self, placeholder):
        """The kernels' CuSeqQ, CuSeqK arguments (``placeholder`` where there are none)."""
        return (placeholder, placeholder) if self.cu_q is None else (self.cu_q, self.cu_k)


def packed_dims(q, k, cu_seqlens=None, max_seqlen=None) -> Dims:
    """``Dims`` of dense q (B, Hq, Nq, D), k (B, Hkv, Nk, D), or, with cu_seqlens=(cu_q, cu_k)
    and max_seqlen=(max_q, max_k), of packed q (total_q, Hq, D), k (total_k, Hkv, D)."""
    if cu_seqlens is None:
        B, Hq, Nq, D = q.shape
        return Dims((B, Hq, k.shape[1], Nq, k.shape[2], D), None, None, 0)
    total_q, Hq, D = q.shape
    cu_q, cu_k = cu_seqlens
    return Dims((cu_q.numel() - 1, Hq, k.shape[1], *max_seqlen, D), cu_q, cu_k, total_q)
