"""Where and how the kernels run: device detection, the Triton interpreter switch, size presets,
and the kernel options (``KernelOptions``), the process's one piece of mutable state.

Triton reads TRITON_INTERPRET when ``@triton.jit`` runs (not at ``import triton``), so this
module must be imported before any kernel is defined; ``flashlib/__init__.py`` imports it first.
On a machine without a CUDA GPU it turns the interpreter on, and every kernel then runs on the
CPU, one program after another, on CPU tensors: slow (about 5 ms per program per loop step) but
exact enough to learn from and to test. Limits of the interpreter that the kernels respect:
bfloat16 arithmetic and ``tl.dot`` are wrong there, ``do_bench`` and autotuning need a GPU, and
races cannot show because programs never overlap.
"""
import contextlib
import dataclasses
import os
from typing import Callable, Optional

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _repair_interpreter_scalars() -> None:
    """Let the interpreter use a scalar in ``range(0, n, BLOCK)`` under NumPy >= 2.4 on older Triton.

    The interpreter holds a kernel's scalars as 1-element arrays and, up to Triton 3.6 (the GPU
    machines' version), converts them with ``int(array)``, which NumPy 2.4 refuses ("only
    0-dimensional arrays can be converted to Python scalars"): every kernel whose loop bound is an
    argument failed there. Newer Triton converts as below; this does the same on any version.
    """
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_flashlib_repaired", False):
        return

    def index(self):
        return int(self.handle.data.item())

    def patch_lang_tensor(tensor, *args):   # (tensor), (tensor, builder) or (tensor, scope)
        patch(tensor, *args)
        if args and hasattr(args[0], "set_attr"):
            args[0].set_attr(tensor, "__index__", index)   # undone after the launch, as Triton's
        else:
            tensor.__index__ = index

    patch_lang_tensor._flashlib_repaired = True
    interpreter._patch_lang_tensor = patch_lang_tensor


if INTERPRET:
    _repair_interpreter_scalars()
DEVICE = torch.device("cuda" if HAS_CUDA and not INTERPRET else "cpu")


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """How the kernels are chosen and launched: the one set of switches, read from the environment
    once (``from_env``), overridable per call (``kernel_options=`` on the public functions) or for
    a block (``kernel_options(...)``), as FlexAttention's ``kernel_options``. Nothing else flips.

    fa3: FlashAttention-3's Hopper kernels where they run (FLASHLIB_FA3=0: off). fa3_from_flops:
    FA3 takes problems of at least this many FLOPs executed (4 B Hq Nq Nk D, halved if causal);
    below it FA2's autotuned kernels and shorter launches cost less (benchmarks/probes/NOTES.md).
    fa3_fwd_mod_head_dims: head dims at which FA3's forward takes a score modifier (its softmax
    warpgroups are its bound; the hook's work lands there). autotune: autotune the block configs on
    a GPU (FLASHLIB_AUTOTUNE=0: the first config that fits; the interpreter always uses one).
    fast_launch: replay recorded launches (``kernels/launch.py``; FLASHLIB_FAST_LAUNCH=0: plain
    ``kernel[grid](...)``). fa3_fold_scale: FA3's forward multiplies its scores' factor inside
    exp2's FFMA. fa3_dq_before_dk: FA3's backward issues dQ's first slice before dK's wgmma.
    fa3_smem_bytes: shared memory FA3's kernels size their pipelines for (None: an sm90 block's,
    ``fa3_fwd.SMEM_BYTES``). decode_append: ``KVCache.attend(q, k_new, v_new)`` writes the new
    keys and values inside its decoding launch instead of before it. decode_page_ids_ahead: a
    paged decoding launch of one wave at most loads each key tile's page ids one tile ahead
    (``kernels.decode.page_ids_ahead``; False: never).
    launch_hook: None, or ``hook(kernel, grid, args, kwargs)`` called in place of every launch
    (``kernels.launch.run``), with the device checks off: it records launches for compiling
    without a GPU (``kernels/targets.py``) or profiling (``teach/profile.py``).
    """
    fa3: bool = True
    fa3_from_flops: int = 1 << 36
    fa3_fwd_mod_head_dims: tuple = (128,)
    autotune: bool = True
    fast_launch: bool = True
    fa3_fold_scale: bool = True
    fa3_dq_before_dk: bool = True
    fa3_smem_bytes: Optional[int] = None
    decode_append: bool = True
    decode_page_ids_ahead: bool = True
    launch_hook: Optional[Callable] = None

    def __hash__(self):
        # hashed once, on first use (launch plans key on the options at every call); not in
        # __init__, which torch.compile traces when a call passes a dict (Dynamo in torch 2.11
        # cannot trace hash() of a tuple)
        try:
            return self._hash
        except AttributeError:
            object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self))))
            return self._hash

    def op_args(self) -> list:
        """These options as torch's custom ops take them (no objects): a list of ints, the inverse
        of ``from_op_args``. The launch hook stays behind (it records eager launches only)."""
        smem = -1 if self.fa3_smem_bytes is None else self.fa3_smem_bytes
        return [*(int(getattr(self, name)) for name in _INT_OPTIONS), smem, *self.fa3_fwd_mod_head_dims]

    @classmethod
    def from_env(cls, environ=None) -> "KernelOptions":
        """The defaults with FLASHLIB_FA3, FLASHLIB_AUTOTUNE and FLASHLIB_FAST_LAUNCH ("0": off)."""
        environ = os.environ if environ is None else environ
        on = {name: environ.get(var, "1") != "0" for name, var in ENVIRONMENT.items()}
        return cls(**on)

    def replace(self, **changes) -> "KernelOptions":
        """These options with ``changes``; an unknown name or a value of the wrong type is a
        TypeError naming it."""
        for name, value in changes.items():
            if name not in _OPTION_TYPES:
                raise TypeError(f"unknown kernel option {name!r}; known: {sorted(_OPTION_TYPES)}")
            kind = _OPTION_TYPES[name]
            if not (value is None and name in _OPTIONAL or isinstance(value, kind)
                    and not (kind is int and isinstance(value, bool))):
                raise TypeError(f"kernel option {name} must be {kind.__name__}, got {value!r}")
        return dataclasses.replace(self, **changes)


_INT_OPTIONS = ("fa3", "fa3_from_flops", "autotune", "fast_launch", "fa3_fold_scale", "fa3_dq_before_dk",
                "decode_append", "decode_page_ids_ahead")
_from_op_args = {}   # KernelOptions.op_args() as a tuple -> the KernelOptions


def from_op_args(values) -> KernelOptions:
    """The ``KernelOptions`` a custom op received as ``op_args()`` (one object per distinct list)."""
    key = tuple(values)
    found = _from_op_args.get(key)
    if found is None:
        n = len(_INT_OPTIONS)
        fields = {name: type(getattr(OPTIONS, name))(value) for name, value in zip(_INT_OPTIONS, key)}
        found = _from_op_args[key] = KernelOptions(**fields, fa3_smem_bytes=None if key[n] < 0 else key[n],
                                                   fa3_fwd_mod_head_dims=key[n + 1:])
    return found


ENVIRONMENT = {"fa3": "FLASHLIB_FA3", "autotune": "FLASHLIB_AUTOTUNE", "fast_launch": "FLASHLIB_FAST_LAUNCH"}
_OPTION_TYPES = {"fa3": bool, "fa3_from_flops": int, "fa3_fwd_mod_head_dims": tuple, "autotune": bool,
                 "fast_launch": bool, "fa3_fold_scale": bool, "fa3_dq_before_dk": bool, "decode_append": bool,
                 "decode_page_ids_ahead": bool, "fa3_smem_bytes": int, "launch_hook": object}
_OPTIONAL = ("fa3_smem_bytes", "launch_hook")   # may be None
OPTIONS = KernelOptions.from_env()   # the options in force: set only by kernel_options() below
_resolved = {}                       # (options, per-call dict's items) -> KernelOptions


def options(kernel_options=None) -> KernelOptions:
    """The options for one call: those in force (``OPTIONS``) with ``kernel_options`` (None, a
    dict of option names to values, or a ``KernelOptions``) applied. A dict's result is cached,
    so a call that passes the same dict each time builds nothing."""
    if kernel_options is None:
        return OPTIONS
    if isinstance(kernel_options, KernelOptions):
        return kernel_options
    if not isinstance(kernel_options, dict):
        raise TypeError(f"kernel_options must be a dict or a KernelOptions, got "
                        f"{type(kernel_options).__name__}")
    key = (OPTIONS, tuple(kernel_options.items()))
    try:
        found = _resolved.get(key)
    except TypeError:   # an unhashable value (a list): ``replace`` names the option
        return OPTIONS.replace(**kernel_options)
    if found is None:
        if len(_resolved) > 256:
            _resolved.clear()
        found = _resolved[key] = OPTIONS.replace(**kernel_options)
    return found


@contextlib.contextmanager
def kernel_options(**changes):
    """``with flashlib.kernel_options(fa3=False, autotune=False): ...``: these options in force
    inside the block, for every call that passes no ``kernel_options`` of its own (process-wide,
    like ``torch.backends`` switches; a backward uses the options its forward ran with)."""
    global OPTIONS
    saved = OPTIONS
    OPTIONS = OPTIONS.replace(**changes)
    try:
        yield OPTIONS
    finally:
        OPTIONS = saved


def autotuning(options_in_force: KernelOptions) -> bool:
    """Whether kernels autotune under these options: on a GPU, with ``autotune`` on."""
    return options_in_force.autotune and DEVICE.type == "cuda"


_gpu_names = {}   # a dict, not functools.cache, which torch.compile warns about


TANH_APPROX_ERROR = 2.0 ** -10.99   # tanh.approx.f32's largest relative error (PTX ISA)


def approximate_tanh(dtype, device) -> bool:
    """Whether the kernels' softcap of ``dtype`` inputs on ``device`` takes the GPU's one-instruction
    tanh (``kernels.score_mod.tanh_softcap_approx``, relative error up to ``TANH_APPROX_ERROR``):
    bfloat16 on a GPU; the interpreter runs no PTX. Here, beside the device facts, because the
    kernels pick by it and ``flashlib.testing`` allows for its error."""
    return dtype == torch.bfloat16 and torch.device(device).type == "cuda" and not INTERPRET


def gpu_name(device=None) -> str:
    """Short name of ``device``'s GPU (the current one by default): "h100", "t4", ...; "cpu"
    without one. Names benchmark folders and picks the kernels' per-GPU tables."""
    if not HAS_CUDA or (device is not None and torch.device(device).type != "cuda"):
        return "cpu"
    if device not in _gpu_names:
        name = torch.cuda.get_device_name(device).lower()
        known = ("h200", "h100", "a100", "a10g", "l40s", "l4", "t4", "v100", "4090", "3090")
        _gpu_names[device] = (next((k for k in known if k in name), None)
                              or name.replace("nvidia", "").strip().replace(" ", "_"))
    return _gpu_names[device]


def preset(cpu, gpu):
    """Pick a size for this machine: small through the interpreter, real on a GPU."""
    return cpu if DEVICE.type == "cpu" else gpu


def is_interpreted(kernel) -> bool:
    """True if ``kernel`` (a ``@triton.jit`` function) was defined with the interpreter on."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_kernel(kernel, name: str | None = None) -> None:
    """Raise a clear error, instead of Triton's "0 active drivers", for a kernel that cannot run.

    On a CPU-only machine a kernel works only if it was defined after TRITON_INTERPRET=1 was set,
    which ``import flashlib`` does; so must Triton's own helpers (tl.max, tl.sum, ...), which
    ``triton.language`` defines with ``@triton.jit`` when it is imported: ``import flashlib``
    has to come before ``import triton``. The fix for either is to restart and import in order.
    """
    if DEVICE.type != "cpu" or OPTIONS.launch_hook is not None:
        return
    import triton.language as tl
    if not is_interpreted(tl.max):
        raise RuntimeError(
            "triton was imported before flashlib, so Triton's interpreter cannot run tl.max, "
            "tl.sum, ...: put `import flashlib` before `import triton` (restart the kernel or "
            "Python first), or set TRITON_INTERPRET=1 before starting Python")
    if not is_interpreted(kernel):
        name = name or getattr(kernel, "__name__", "this kernel")
        raise RuntimeError(
            f"{name} was defined before Triton's interpreter was turned on, and this machine has "
            "no CUDA GPU. Run `import flashlib` (it sets TRITON_INTERPRET=1) before defining "
            "kernels, then re-run the cell that defines it; or set TRITON_INTERPRET=1 before "
            "starting Python.")


_capabilities = {}   # a dict, not functools.cache, which torch.compile warns about


def capability(device: torch.device) -> tuple[int, int]:
    """``device``'s CUDA compute capability, e.g. (9, 0); asked of the driver once."""
    if device not in _capabilities:
        _capabilities[device] = torch.cuda.get_device_capability(device)
    return _capabilities[device]


def check_device(name: str, t: torch.Tensor) -> None:
    """Kernels run on CUDA tensors, or on CPU tensors through the interpreter (or anywhere while a
    ``launch_hook`` records the launches instead of running them)."""
    if t.device.type == "cuda" or OPTIONS.launch_hook is not None:
        if INTERPRET and t.device.type == "cuda":
            raise ValueError(f"{name} is on {t.device} but TRITON_INTERPRET=1 is set: "
                             "use CPU tensors with the interpreter, or unset it")
        return
    if t.device.type == "cpu" and INTERPRET:
        return
    raise ValueError(f"{name} is on {t.device}: flashlib's kernels need a CUDA tensor, or a CPU "
                     "tensor with Triton's interpreter on (TRITON_INTERPRET=1, set by "
                     "`import flashlib` on machines without a GPU)")


_LIBRARY = torch.library.Library("flashlib", "FRAGMENT")   # holds the ops define_op registers


def define_op(name: str, impl: Callable, fake: Callable):
    """Register ``impl`` as the torch operator ``flashlib::<name>`` (schema from its annotations,
    kernels for CPU and CUDA) with ``fake`` for tracing, and return the op (its OpOverload).

    What torch.compile calls instead of a launcher it cannot trace. torch.library's define/impl,
    not ``@torch.library.custom_op``: the latter's wrappers (aliasing checks, a Python autograd
    kernel, a Dynamo guard) cost more host time per call than the launch they wrap
    (benchmarks/probes/op_host_probe.py). The op has no autograd of its own: the caller wraps
    it in an autograd.Function, which Dynamo traces (``ops.OpAttention``). Defined already
    (flashlib's source run a second time, a reload): the op there is returned as it is."""
    if hasattr(torch.ops.flashlib, name):
        return getattr(torch.ops.flashlib, name).default
    _LIBRARY.define(name + torch.library.infer_schema(impl, mutates_args=()))
    for device in ("cpu", "cuda"):
        torch.library.impl(f"flashlib::{name}", device, impl, lib=_LIBRARY)
    torch.library.register_fake(f"flashlib::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.flashlib, name).default

