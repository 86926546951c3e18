"""Where the kernels run: device detection, the Triton interpreter switch, size presets.

Triton reads TRITON_INTERPRET when ``@triton.jit`` runs (not at ``import triton``), so this
module must be imported before any kernel is defined; ``flashlib/__init__.py`` imports it first.
On a machine without a CUDA GPU it turns the interpreter on, and every kernel then runs on the
CPU, one program after another, on CPU tensors: slow (about 5 ms per program per loop step) but
exact enough to learn from and to test. Limits of the interpreter that the kernels respect:
bfloat16 arithmetic and ``tl.dot`` are wrong there, ``do_bench`` and autotuning need a GPU, and
races cannot show because programs never overlap.
"""
import os

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
# GPU kernels autotune over a few block configs; FLASHLIB_AUTOTUNE=0 uses the first config only
# (quick compiles for tests). The interpreter always uses one small fixed config.
AUTOTUNE = DEVICE.type == "cuda" and os.environ.get("FLASHLIB_AUTOTUNE", "1") != "0"


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
        _gpu_names[device] = next((k for k in known if k in name), None) or \
            name.replace("nvidia", "").strip().replace(" ", "_")
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
    if DEVICE.type != "cpu":
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
    """Kernels run on CUDA tensors, or on CPU tensors through the interpreter."""
    if t.device.type == "cuda":
        if INTERPRET:
            raise ValueError(f"{name} is on {t.device} but TRITON_INTERPRET=1 is set: "
                             "use CPU tensors with the interpreter, or unset it")
        return
    if t.device.type == "cpu" and INTERPRET:
        return
    raise ValueError(f"{name} is on {t.device}: flashlib's kernels need a CUDA tensor, or a CPU "
                     "tensor with Triton's interpreter on (TRITON_INTERPRET=1, set by "
                     "`import flashlib` on machines without a GPU)")
