"""The launch layer: compiled Triton kernels called with little host time (every launcher uses it).

Why: at 256 tokens a forward+backward's kernels take tens of microseconds on a Hopper GPU, but
``kernel[grid](...)`` binds and specializes every argument (30-40 here), builds a cache key from
them and looks the compiled kernel up, in Python, at every call; the launchers then recompute
sizes, strides, configs and grids that did not change since the last step. Two memos remove that:

- ``fast_launch`` remembers the compiled kernel per call signature (everything Triton specializes
  on, or finer: each tensor's dtype and 16-byte alignment, every other argument's value, the
  device) and returns a ``Launch``: the compiled kernel, its grid and its scalar arguments.
- ``plan_key`` gives a launcher a key for its whole call (shapes, strides, dtypes, alignments,
  options); the launcher keeps the ``Launch``es its first call with that key recorded, and later
  calls only allocate their outputs and replay them with the new tensors (``Launch.__call__``):
  no argument binding, no recomputation, no autotuner bookkeeping. Autotuning still happens on
  the first call of a new key, through Triton's own ``kernel[grid](...)``.

Direct launches call the compiled kernel's launcher (``CompiledKernel.run`` and, for kernels that
need no scratch memory, its C entry point ``launch``), internals of Triton whose signatures are
those of the versions in ``TESTED_TRITON``. Elsewhere, through the interpreter, with Triton's launch hooks
set (profilers), while torch.compile traces (Dynamo cannot trace the memos), or with the
``fast_launch`` option off (``runtime.KernelOptions``, FLASHLIB_FAST_LAUNCH=0), every call is a
plain ``kernel[grid](...)``; with a ``launch_hook`` option, every launch goes to the hook instead
(``run``: the one launch point, for the launches that are never replayed too).
"""
from typing import NamedTuple

import torch
import triton

from .. import runtime

TESTED_TRITON = ("3.6.",)
MAX_SIGNATURES = 256     # per memo; a loop that keeps changing shapes starts the memo again
# direct launches need compiled kernels and the launcher internals of a tested Triton
SUPPORTED = not runtime.INTERPRET and triton.__version__.startswith(TESTED_TRITON)

_compiled = {}           # kernel -> {call signature: (CompiledKernel, constexpr names, config)}


class Descriptor(NamedTuple):
    """A host TMA descriptor as Triton's launcher reads one (``make_tensordesc_arg``: the base
    tensor, shape, strides, padding). A replay passes these where the first call passed Gluon
    ``TensorDescriptor``s, whose constructor's checks (passed on that call) cost more than the
    launch; the shape and strides come from the plan, whose key pinned the tensor's."""
    base: torch.Tensor
    shape: list
    strides: list
    padding: str = "zero"

    @staticmethod
    def view(desc):
        """(shape, strides) of a TensorDescriptor, to rebuild it around another tensor."""
        return list(desc.shape), list(desc.strides)


class Launch(NamedTuple):
    """One recorded launch: call it with the kernel's tensor arguments (they come first in
    every flashlib kernel; TMA descriptors as ``Descriptor``s) to launch the same compiled
    kernel, grid and scalars again."""
    call: object             # the compiled launcher's C entry point (Triton's wrapper if scratch)
    grid: tuple              # (x, y, z)
    stream_of: object        # device index -> its current stream
    device: int
    function: int            # the loaded CUfunction
    head: tuple              # the launcher's fixed arguments between the function and the kernel's
    scalars: tuple           # the arguments after the tensors, then the constexprs, in order
    tensors_only: bool = False   # no TMA descriptor among the first call's tensor arguments

    def __call__(self, *tensors):
        # addresses, not tensors: given a tensor, Triton's launcher calls its data_ptr() and asks
        # the driver whether that address is device memory (cuPointerGetAttribute), per tensor
        # and per launch; the plan key already pinned every input's device. Without descriptors
        # the addresses come from one C-level map, not a Python test per argument.
        addresses = (map(_data_ptr, tensors) if self.tensors_only
                     else [t.data_ptr() if isinstance(t, torch.Tensor) else t for t in tensors])
        self.call(*self.grid, self.stream_of(self.device), self.function, *self.head, *addresses,
                  *self.scalars)


_data_ptr = torch.Tensor.data_ptr


def enabled(options) -> bool:
    """Whether launches under ``options`` (a ``runtime.KernelOptions``) may be direct and replayed."""
    return (SUPPORTED and options.fast_launch and options.launch_hook is None
            and not torch.compiler.is_compiling() and not _hooks_set())


def plan_key(tensors, extra, options=None):
    """A launcher's memo key for a call on ``tensors`` with ``extra`` (a tuple of everything
    else its launches depend on: flags, scale, jit functions, sizes) under ``options`` (a
    ``runtime.KernelOptions``, None: those in force; part of the key), or None when the call
    must take the plain path (see the module docstring; also tensors whose last dim is strided,
    which the launchers copy first)."""
    options = runtime.OPTIONS if options is None else options
    if not enabled(options):
        return None
    key = [extra, options]
    for t in tensors:
        stride = t.stride()
        if stride[-1] != 1:
            return None
        key += (t.shape, stride, t.dtype, t.data_ptr() & 15, t.get_device())
    return tuple(key)


def remember(plans, key, plan):
    """``plans[key] = plan`` if the call could be planned (key and every launch not None)."""
    if key is None or plan is None or None in plan:
        return
    if len(plans) >= MAX_SIGNATURES:
        plans.clear()
    plans[key] = plan


def _signature(device, args, kwargs):
    # ints first: most arguments are strides and sizes (this runs at every launch)
    return (device, *kwargs.items(), *[a if type(a) is int else (a.dtype, a.data_ptr() & 15 == 0)
                                       if isinstance(a, torch.Tensor) else _descriptor_signature(a)
                                       if _is_descriptor(a) else a for a in args])


def _is_descriptor(a):
    return hasattr(a, "block_shape") and hasattr(a, "base")   # Triton's and Gluon's TensorDescriptor


def _descriptor_signature(d):
    # finer than Triton's (which keys on the block shape and layout): the shape and strides too
    return (d.base.dtype, d.base.data_ptr() & 15 == 0, tuple(d.shape), tuple(d.strides),
            tuple(d.block_shape), str(getattr(d, "layout", None)), getattr(d, "padding", None))


def run(kernel, grid, *args, kernel_options=None, **kwargs):
    """``kernel[grid](*args, **kwargs)``, or the ``launch_hook`` of ``kernel_options`` (None: the
    options in force) called with ``(kernel, grid, args, kwargs)`` instead. Returns what either
    returns. Every flashlib launch goes through here or ``fast_launch``."""
    hook = (runtime.OPTIONS if kernel_options is None else kernel_options).launch_hook
    if hook is not None:
        return hook(kernel, grid, args, kwargs)
    return kernel[grid](*args, **kwargs)


def fast_launch(kernel, grid, *args, kernel_options=None, **kwargs):
    """``kernel[grid](*args, **kwargs)``, with the arguments' binding and the kernel's look-up
    skipped after the first call of each signature. Returns the ``Launch`` (None on the plain
    path). kernel: a ``@triton.jit`` function, or a ``triton.autotune`` of one, whose choice is
    remembered with the compiled kernel (the signature holds every value its key reads); grid: a
    tuple of up to 3 ints, or a function of the meta-parameters as in Triton; args: the kernel's
    parameters up to its constexprs, tensors first; kwargs: the constexprs and launch options the
    caller sets. kernel_options: a ``runtime.KernelOptions``, None for those in force."""
    options = runtime.OPTIONS if kernel_options is None else kernel_options
    if not enabled(options):
        run(kernel, grid, *args, kernel_options=options, **kwargs)
        return None
    device = _driver().get_current_device()
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
        memo[key] = hit = compiled, names, chosen
    else:
        compiled = None
    launch = _record(hit, grid, args, kwargs)
    if compiled is None:   # launched above by Triton itself on a miss
        launch(*args[:_tensor_count(args)])
    return launch


def _tensor_count(args):
    """How many of args come before the scalars: tensors and TMA descriptors."""
    return next((i for i, a in enumerate(args) if not (isinstance(a, torch.Tensor) or _is_descriptor(a))),
                len(args))


def _record(hit, grid, args, kwargs):
    compiled, constexpr_names, chosen = hit
    meta = {**kwargs, **chosen}
    grid = (*(grid(meta) if callable(grid) else grid), 1, 1)[:3]
    count = _tensor_count(args)
    scalars = args[count:]
    if any(isinstance(a, torch.Tensor) or _is_descriptor(a) for a in scalars):
        raise TypeError("fast_launch: a kernel's tensor and descriptor arguments must come before "
                        "its scalars")
    driver = _driver()
    launcher = compiled.run
    if getattr(launcher, "global_scratch_size", 1) == 0 and getattr(launcher, "profile_scratch_size", 1) == 0:
        # no scratch to allocate per launch: call the C entry point Triton's wrapper would call
        call, head = launcher.launch, (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                                       compiled.packed_metadata, None, None, None)
    else:
        call, head = launcher, (compiled.packed_metadata, None, None, None)
    return Launch(call, grid, driver.get_current_stream, driver.get_current_device(), compiled.function,
                  head, (*scalars, *(meta[name] for name in constexpr_names)),
                  all(isinstance(a, torch.Tensor) for a in args[:count]))


def _driver():
    return triton.runtime.driver.active


def _hooks_set():
    """Whether a launch hook is registered (Triton's profilers use them): then launch plainly,
    so that the hooks see every launch. The hooks are HookChains, empty ones when unused."""
    hooks = triton.knobs.runtime
    return any(getattr(hook, "calls", hook) for hook in (hooks.launch_enter_hook,
                                                          hooks.launch_exit_hook))
