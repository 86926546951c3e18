"""Launching a compiled Triton kernel with less host time (the decode, dense and block-sparse
launchers use it).

Why: one decoding step over a 1k-key cache is 13-17 us of GPU work on an H100, but at every call
``kernel[grid](...)`` binds and specializes every argument (35 for the decode kernel), builds a
cache key from them and looks the compiled kernel up, in Python. A decoding loop calls the same
kernel with the same shapes at every step, so ``fast_launch`` remembers the compiled kernel per
call signature and launches it directly: 15-23 us less host time per decoding call on H100 hosts
(benchmarks/results/h100/decode_host_time.log; GPU times from decode_float16.json). A call
signature is everything Triton specializes on, or finer: each tensor's dtype and 16-byte alignment,
every other argument's value (ints, floats, constexprs, ``num_warps``...), and the device. A new
signature goes through Triton's own ``kernel[grid](...)`` (compiling if needed), which returns the
kernel to remember.

Direct launches call ``CompiledKernel.run``, an internal of Triton; its signature is the one of
the versions in ``TESTED_TRITON``. Elsewhere, through the interpreter, with Triton's launch hooks
set (profilers), while torch.compile traces (Dynamo cannot trace the memo), or with
``FLASHLIB_FAST_LAUNCH=0``, every call is a plain ``kernel[grid](...)``.
"""
import os

import torch
import triton

from .. import runtime

TESTED_TRITON = ("3.6.",)
MAX_SIGNATURES = 256     # per kernel; a loop that keeps changing shapes starts the memo again
ENABLED = (not runtime.INTERPRET and triton.__version__.startswith(TESTED_TRITON)
           and os.environ.get("FLASHLIB_FAST_LAUNCH", "1") != "0")

_compiled = {}           # kernel -> {call signature: CompiledKernel}


def _signature(device, args, kwargs):
    # ints first: most arguments are strides and sizes (this runs at every launch)
    return (device, *kwargs.items(), *[a if type(a) is int else (a.dtype, a.data_ptr() & 15 == 0)
                                       if isinstance(a, torch.Tensor) else a for a in args])


def fast_launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, with the arguments' binding and the kernel's look-up
    skipped after the first call of each signature. kernel: a ``@triton.jit`` function, or a
    ``triton.autotune`` of one, whose choice is remembered with the compiled kernel (the
    signature holds every value its key reads); grid: a tuple of up to 3 ints, or a function of
    the meta-parameters as in Triton; args: the kernel's parameters up to its constexprs; kwargs:
    the constexprs and launch options the caller sets."""
    if not ENABLED or torch.compiler.is_compiling() or _hooks_set():
        return kernel[grid](*args, **kwargs)
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    memo = _compiled.setdefault(kernel, {})
    key = _signature(device, args, kwargs)
    hit = memo.get(key)
    if hit is None:
        if len(memo) >= MAX_SIGNATURES:
            memo.clear()
        compiled = kernel[grid](*args, **kwargs)
        tuner = isinstance(kernel, triton.runtime.Autotuner)
        chosen = dict(kernel.best_config.kwargs) if tuner else {}
        # CompiledKernel.run takes every parameter in order, constexprs included (it skips them)
        names = [p.name for p in (kernel.fn if tuner else kernel).params[len(args):]]
        memo[key] = compiled, names, chosen
        return compiled
    compiled, constexpr_names, chosen = hit
    meta = {**kwargs, **chosen}
    grid = (*(grid(meta) if callable(grid) else grid), 1, 1)
    compiled.run(grid[0], grid[1], grid[2], driver.get_current_stream(device), compiled.function,
                 compiled.packed_metadata, None, None, None,
                 *args, *(meta[name] for name in constexpr_names))
    return compiled


def _hooks_set():
    """Whether a launch hook is registered (Triton's profilers use them): then launch plainly,
    so that the hooks see every launch. The hooks are HookChains, empty ones when unused."""
    hooks = triton.knobs.runtime
    return any(getattr(hook, "calls", hook) for hook in (hooks.launch_enter_hook,
                                                          hooks.launch_exit_hook))
