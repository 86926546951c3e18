"""Block configs: autotuned on a GPU, one fixed config otherwise, always sized to fit SRAM.

Autotuning compiles and times every config once per key (problem size bucket, head dim, causal,
precision, score modifier, packed or dense), so it runs only on a GPU with the ``autotune`` option
on (``runtime.KernelOptions``), only for 16-bit inputs and only for problems of at least
``TUNE_FROM_SCORES`` scores; otherwise (and with FLASHLIB_AUTOTUNE=0) kernels take the first
config that fits. The choices are kept on disk (``SavedChoices``): a new process reuses them.
float32 is the checking path, not the fast one: its exact dots are FMA loops
whose compile time grows with the tile, so a sweep of configs would take minutes. Through the interpreter (no GPU)
kernels use 64x64 blocks: the interpreter's cost is per program per loop step, whatever the
tile size.

Shared memory: a kernel keeps ``resident`` rows of headdim (e.g. its Q block) and pipelines
``streamed`` rows per stage (e.g. a K and a V block), so it needs about
``elem_bytes * BLOCK_D * (resident + num_stages * streamed)`` bytes (this matches what Triton
reports); configs over the GPU's per-block limit are dropped before compiling. The GPU is
``target()``: the one in use, or one of ``TARGETS`` that ``kernels/targets.py`` compiles for.
"""
import contextlib
import functools
import hashlib
import json
import os
import tempfile
from typing import NamedTuple, Optional

import torch
import triton

from .. import runtime
from ..inputs import resolve_scale

INTERPRETER_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64}
# The autotuner's key: the sizes that move the best tile, and the constexprs that choose code (a
# score modifier, the softmax's tile update, packed sequences): a config tuned on plain scores is
# not reused for a softcap at the same size, where the registers it needs differ (the d128 dK/dV
# kernel spills 248 bytes with one, ptxas for sm90)
KEY = ["n_bucket", "BLOCK_D", "CAUSAL", "DOT_PRECISION", "SCORE_MOD", "TILE_UPDATE", "VARLEN"]
# Problems with fewer scores (batch x heads x seqlen_q x seqlen_k) are not autotuned: their kernels
# take microseconds, less than the host's time per call, and tuning them compiled every config
# for each new shape (lesson 11's sampling and gradient check took minutes: benchmarks/probes/NOTES.md).
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
    and of the (batch, head) slices, packed in one int. Both move the best tile (a config tuned on
    a few heads picks small query blocks, to fill the GPU, which lose on many heads:
    benchmarks/probes/NOTES.md); a first call on a slice must not decide for the whole."""
    length = min(next_power_of_2(max(lengths)), 1 << 16)
    return length * 2048 + min(next_power_of_2(slices), 1024)


class Target(NamedTuple):
    """What a kernel's block config depends on: the GPU's compute capability and the shared memory
    one program may use (bytes)."""
    capability: tuple
    smem: int


# The GPUs the course names, for compiling without them (kernels/targets.py, tests/test_targets.py).
# sm75 (Colab's T4): no cp.async, so Triton does not pipeline (num_stages is ignored), fp16 dots
# only (no bfloat16), 64 KB a block; sm80 A100 163 KB; sm86/sm89 (RTX 30xx/40xx, A10, L4) 99 KB;
# sm90 H100/H200 227 KB.
TARGETS = {"t4": Target((7, 5), 64 << 10), "a100": Target((8, 0), 163 << 10),
           "l4": Target((8, 9), 99 << 10), "h100": Target((9, 0), 227 << 10)}
_compiling_for = []   # a Target while kernels/targets.py compiles for a GPU this machine lacks


@contextlib.contextmanager
def compiling_for(gpu: Target):
    """Configs chosen for ``gpu`` inside the block (``target()``), for compiling without it."""
    _compiling_for.append(gpu)
    try:
        yield gpu
    finally:
        _compiling_for.pop()


@functools.cache
def _device_target() -> Target:
    props = torch.cuda.get_device_properties(0)
    return Target((props.major, props.minor),
                  getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024)


def target() -> Target:
    """The GPU the kernels are configured for: the one in use (read once: the driver query costs
    microseconds and configs are chosen at every launch), or the one ``targets.compile_for``
    compiles for."""
    return _compiling_for[-1] if _compiling_for else _device_target()


def smem_bytes(resident, streamed, stages, block_d, elem_bytes, gpu=None):
    """Shared memory a config needs on ``gpu`` (default ``target()``): see the module docstring.
    Before sm80 Triton does not pipeline (no cp.async) but keeps a second copy of the resident
    blocks for the dot operands' layouts: ``resident`` counts twice and ``stages`` not at all
    (what it allocated for every config of the dense kernels compiled for sm75: kernels/targets.py)."""
    if (gpu or target()).capability < (8, 0):
        return elem_bytes * block_d * (2 * resident + streamed)
    return elem_bytes * block_d * (resident + stages * streamed)


def tuned(kernel, configs, footprint, elem_arg="Q", key=KEY, prefer=None):
    """Wrap ``kernel`` for launching; return ``choose(block_d, elem_bytes, scores, max_block=None)
    -> (launchable, launch kwargs)``: ``triton.autotune(kernel)`` and {} when autotuning, else
    ``kernel`` and the first config that fits.

    configs: (BLOCK_M, BLOCK_N, num_warps, num_stages) tuples, best guess first. prefer: a
    function of the padded head dim giving the config to try before them when not autotuning
    (the best fixed config differs between head dims: measured, not guessed).
    footprint(BLOCK_M, BLOCK_N) -> (resident_rows, streamed_rows_per_stage), see module docstring.
    scores: the problem's size, batch x heads_q x seqlen_q x seqlen_k; under ``TUNE_FROM_SCORES``
    (or for float32 inputs) the first config is used even when autotuning. Blocks above ``max_block`` are dropped
    (block-sparse tiles must fit inside one mask block; there the kernel's SPARSE_BLOCK argument
    sets the limit when autotuning).
    """
    def fits(cfg, block_d, elem_bytes, max_block):
        bm, bn, _, stages = cfg
        resident, streamed = footprint(bm, bn)
        small = max_block is None or max(bm, bn) <= max_block
        return small and smem_bytes(resident, streamed, stages, block_d, elem_bytes) <= target().smem

    @functools.cache
    def first_fitting(block_d, elem_bytes, max_block, gpu):
        if runtime.INTERPRET:
            return {k: min(v, max_block or v) for k, v in INTERPRETER_CONFIG.items()}
        fitting = [c for c in ([prefer(block_d)] if prefer else []) + list(configs)
                   if fits(c, block_d, elem_bytes, max_block)]
        bm, bn, warps, stages = fitting[0] if fitting else (16, 16, 4, 1)
        return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)

    def prune(triton_configs, named_args, **kwargs):
        block_d = named_args.get("BLOCK_D", kwargs.get("BLOCK_D"))
        max_block = named_args.get("SPARSE_BLOCK", kwargs.get("SPARSE_BLOCK"))
        elem_bytes = named_args[elem_arg].element_size()
        keep = [c for c in triton_configs if fits((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                                                   c.num_stages), block_d, elem_bytes, max_block)]
        return keep or [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]

    triton_configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                      for bm, bn, w, s in configs]
    key = [name for name in key if name in kernel.arg_names]   # newer Tritons refuse other names
    autotuner = triton.autotune(triton_configs, key=key, prune_configs_by={"early_config_prune": prune})(kernel)
    autotuner.cache = SavedChoices(kernel)

    def choose(block_d, elem_bytes, scores, max_block=None, autotune=None):
        """autotune: None for the options in force (``runtime.autotuning``)."""
        autotune = runtime.autotuning(runtime.OPTIONS) if autotune is None else autotune
        if not autotune or scores < TUNE_FROM_SCORES or elem_bytes > 2:
            return kernel, first_fitting(block_d, elem_bytes, max_block, None if runtime.INTERPRET else target())
        return autotuner, {}
    return choose


class SavedChoices(dict):
    """An autotuner's choices (its ``cache``: key -> ``triton.Config``), also kept on disk, so a new
    process, or another rank of a ring, runs the config tuned before instead of timing them all.

    Triton's own ``cache_results`` cannot store these keys: they hold the score modifier and the
    tile update, @triton.jit functions that JSON refuses. Here a key is stored as its ``str`` (a jit
    function prints as its module and name) in one JSON file per kernel, kernel source, Triton
    version and GPU, under Triton's cache dir (``TRITON_CACHE_DIR``): delete
    ``flashlib_autotune/`` there to tune again. A file is written whole and renamed into place, so
    ranks writing at once lose at most a choice, never the file."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel
        self.path = None         # the file, named on first use: the GPU is known only then
        self.saved = None        # str(key) -> the Config's fields

    def _load(self):
        if self.saved is None:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            source = getattr(self.kernel, "cache_key", "")
            digest = hashlib.sha256(f"{triton.__version__}|{props.name}|{props.major}.{props.minor}|"
                                    f"{source}".encode()).hexdigest()[:16]
            folder = os.path.join(triton.knobs.cache.dir, "flashlib_autotune")
            self.path = os.path.join(folder, f"{self.kernel.__name__}-{digest}.json")
            self.saved = _read_choices(self.path)
        return self.saved

    def __contains__(self, key):
        if super().__contains__(key):
            return True
        fields = self._load().get(str(key))
        try:
            config = triton.Config(dict(fields["kwargs"]), num_warps=int(fields["num_warps"]),
                                   num_stages=int(fields["num_stages"]))
        except (KeyError, TypeError, ValueError):    # none, or an entry edited by hand: tune again
            return False
        super().__setitem__(key, config)
        return True

    def __setitem__(self, key, config):
        super().__setitem__(key, config)
        saved = self._load()
        saved.update(_read_choices(self.path))     # what other processes wrote since
        saved[str(key)] = {"kwargs": dict(config.kwargs), "num_warps": config.num_warps,
                           "num_stages": config.num_stages}
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(self.path), delete=False) as f:
                json.dump(saved, f, indent=0, sort_keys=True)
            os.replace(f.name, self.path)
        except OSError:
            pass    # a read-only cache dir: the choice still holds for this process


def _read_choices(path):
    """A ``SavedChoices`` file's entries; none if it is missing or unreadable."""
    try:
        with open(path) as f:
            entries = json.load(f)
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        return {}


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
