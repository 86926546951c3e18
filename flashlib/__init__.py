"""flashlib: the course's reference implementation of FlashAttention.

The library an engineer imports lives at the top of the package: ``ops`` (the public functions
and their autograd), ``kernels/`` (Triton kernels, the shared tile step, launchers), ``masks``,
``decode`` (KV caches), ``inputs`` (input checks), ``reference`` (the float64 oracle),
``runtime`` (device detection; the interpreter on a CPU; ``KernelOptions``, the switches every
kernel reads, and ``kernel_options``, the block that sets them), ``testing`` (the one tolerance rule)
and ``distributed`` (ring attention across the ranks of a torch.distributed process group).
Three subpackages sit above it and import it, never the other way round: ``teach`` (the lessons'
algorithms and figures), ``course`` (checking and grading exercises, the `flashlib` command) and
``bench`` (benchmark suites, ``python -m flashlib.bench``).

Import order matters: ``runtime`` turns Triton's interpreter on (on machines without a GPU)
before any kernel module defines a ``@triton.jit`` function.
"""
from . import runtime  # noqa: F401  (first: sets TRITON_INTERPRET before kernels are defined)
from . import distributed, masks, reference  # noqa: F401
from .decode import KVCache, PagedKVCache, flash_decode
from .ops import block_sparse_attention, flash_attention, flash_attention_varlen
from .reference import attention_ref
from .runtime import KernelOptions, kernel_options

__all__ = ["KVCache", "KernelOptions", "PagedKVCache", "attention_ref", "block_sparse_attention", "distributed",
           "flash_attention", "flash_attention_varlen", "flash_decode", "kernel_options", "masks", "reference",
           "runtime"]
__version__ = "0.1.0"
