"""Compile every flashlib kernel for a GPU this machine does not have, and say what it needs.

Why: a learner on Colab gets a T4 (sm75: 64 KB of shared memory a block, no pipelining), an
A100 (sm80) or a consumer GPU (sm86/sm89, 99 KB); a config sized for an H100 (227 KB) fails
there at launch ("out of resources: shared memory"). Triton compiles for a named target on any
machine, GPU or not, so each kernel is compiled here with the config its launcher chooses for
that GPU (``config.TARGETS``; ``config.target()`` is that GPU while compiling) and the shared
memory Triton allocated is compared with the GPU's limit.

How: the launchers run as they would (on small CPU tensors), with a ``launch_hook`` option
(``runtime.KernelOptions``) that records each launch's kernel, arguments and launch options
instead of making it (``record_launches``); each recorded launch is then compiled for the
target (``compile_launch``). Kernels must be real ``@triton.jit`` functions, not the interpreter's,
so this runs in a process started with TRITON_INTERPRET=0:

    TRITON_INTERPRET=0 python -m flashlib.kernels.targets t4 a100     # a table per GPU

tests/test_targets.py runs it for each GPU the course names.
"""
import sys
import time

import torch
import triton

from .. import runtime
from . import config

DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
          torch.int32: "i32", torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}


def launches(family, dtype=torch.float16, head_dims=(128, 256)):
    """(kernel, args, kwargs) of each launch one call of ``family``'s launchers makes, recorded on
    small CPU tensors: "forward", "backward" (dense FA2, at each of ``head_dims``), "block_sparse"
    (forward and backward), "decode" (split-KV partial and combine), "fa1", "primer"; the last
    four at d=128."""
    return record_launches(lambda: _call(family, dtype, head_dims))


def record_launches(run) -> list:
    """Call ``run()`` with every flashlib launch recorded instead of made: a list of (kernel, args,
    kwargs). Autotuning is off (the launchers take their first config that fits ``config.target()``)
    and so are the device checks (the tensors are CPU stand-ins)."""
    recorded = []

    def record(kernel, grid, args, kwargs):
        recorded.append((kernel, args, kwargs))

    with runtime.kernel_options(launch_hook=record, autotune=False):
        run()
    return recorded


def _call(family, dtype, head_dims):
    from . import block_sparse, decode, fa1, fa2_bwd, fa2_fwd, primer
    from .. import masks
    t = lambda *shape: torch.randn(*shape).to(dtype)   # noqa: E731
    if family in ("forward", "backward"):
        for D in head_dims:
            q, k = t(1, 4, 300, D), t(1, 2, 300, D)
            out, lse = t(1, 4, 300, D), torch.zeros(1, 4, 300)
            if family == "forward":
                fa2_fwd.fa2_forward(q, k, k, causal=True)
            else:
                fa2_bwd.fa2_backward(q, k, k, out, lse, out, causal=True)
    elif family == "block_sparse":
        q, k = t(1, 4, 300, 128), t(1, 2, 300, 128)
        view = masks.sliding_window(300, 300, 100).kernel_view()
        block_sparse.block_sparse_forward(q, k, k, view)
        block_sparse.block_sparse_backward(q, k, k, q, torch.zeros(1, 4, 300), q, view)
    elif family == "decode":
        q, k = t(2, 8, 1, 128), t(2, 2, 5000, 128)
        decode.decode_partial(q, k, k, torch.tensor([5000, 17], dtype=torch.int32), num_splits=4)
        decode.combine(torch.zeros(2, 8, 1, 4, 128), torch.zeros(2, 8, 1, 4), out_dtype=dtype)
    elif family == "fa1":
        q = t(1, 2, 300, 128)
        fa1.fa1_forward(q, q, q, causal=True)
    elif family == "primer":
        primer.softmax(t(100, 1000))
        primer.matmul(t(300, 200), t(200, 100))
    else:
        raise ValueError(f"unknown kernel family {family!r}")


def compile_for(gpu, family, dtype=torch.float16, head_dims=(128, 256)):
    """Compile ``family``'s launches with the configs chosen for ``gpu`` (a key of
    ``config.TARGETS``). Returns one dict per launch: kernel, config, shared (bytes Triton
    allocated), limit (the GPU's), fits, seconds (compiling)."""
    if runtime.INTERPRET:
        raise RuntimeError("kernels defined under Triton's interpreter cannot be compiled: run "
                           "with TRITON_INTERPRET=0 (python -m flashlib.kernels.targets ...)")
    gpu_target = config.TARGETS[gpu]
    with config.compiling_for(gpu_target):
        recorded = launches(family, dtype, head_dims)
    results = []
    for kernel, args, kwargs in recorded:
        start = time.perf_counter()
        compiled, constexprs, options = compile_launch(kernel, args, kwargs, gpu_target)
        shown = {k: v for k, v in constexprs.items() if k.startswith("BLOCK")}
        results.append(dict(kernel=kernel.__name__, config={**shown, **options},
                            shared=compiled.metadata.shared, limit=gpu_target.smem,
                            fits=compiled.metadata.shared <= gpu_target.smem,
                            seconds=round(time.perf_counter() - start, 1)))
    return results


def compile_launch(kernel, args, kwargs, gpu_target):
    """Compile one recorded launch of ``kernel`` (a ``@triton.jit`` function) for ``gpu_target``
    (a ``config.Target``). Returns (Triton's CompiledKernel, its constexprs, its launch options)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    signature, constexprs = {}, {}
    for i, param in enumerate(kernel.params):
        value = args[i] if i < len(args) else kwargs.get(param.name, param.default)
        if param.is_constexpr or value is None:
            signature[param.name], constexprs[param.name] = "constexpr", value
        else:
            signature[param.name] = triton_type(value)
    major, minor = gpu_target.capability
    compiled = triton.compile(ASTSource(kernel, signature, constexprs),
                              target=GPUTarget("cuda", major * 10 + minor, 32), options=options)
    return compiled, constexprs, options


def triton_type(value) -> str:
    """Triton's signature type of a launch argument: "*fp16" for a float16 tensor, "i32", ..."""
    if isinstance(value, torch.Tensor):
        return "*" + DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for a launch argument {value!r}")


FAMILIES = ("forward", "backward", "block_sparse", "decode", "fa1", "primer")


def main(argv=None):
    import json
    gpus = (argv if argv is not None else sys.argv[1:]) or list(config.TARGETS)
    results = {gpu: {family: compile_for(gpu, family) for family in FAMILIES} for gpu in gpus}
    for gpu, families in results.items():
        print(f"{gpu} ({config.TARGETS[gpu].capability}, {config.TARGETS[gpu].smem >> 10} KB a block)")
        for family, rows in families.items():
            for r in rows:
                print(f"  {family:13}{r['kernel']:26}{r['shared'] >> 10:5} KB  {'fits' if r['fits'] else 'DOES NOT FIT'}"
                      f"  {r['config']}  ({r['seconds']} s)")
    return json.dumps(results)


if __name__ == "__main__":
    main()
