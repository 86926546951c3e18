"""Checking the public functions' inputs, in one place for every entry point and launcher.

``check_qkv`` validates the SDPA layout (batch, heads, seqlen, headdim) and grouped heads and
returns the sizes (the oracle uses it too); ``check_inputs`` adds what the kernels need: torch
tensors of one supported dtype on one device that can run them, a head dim they support, a
boolean ``causal``, and the resolved ``scale`` (1/sqrt(headdim) by default). Errors are
``ValueError``/``TypeError`` naming the argument and what was expected, raised before any kernel
is compiled.
"""
import math
import numbers

import torch

from . import runtime
from .kernels.score_mod import NO_MODIFIERS, Modifiers

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEADDIM = 256


def default_scale(D: int) -> float:
    """The softmax scale when none is given: 1/sqrt(headdim) (the FlashAttention paper, 2.2)."""
    return 1.0 / math.sqrt(D)


def resolve_scale(scale, D: int) -> float:
    """``scale`` as a float, or ``default_scale(D)`` when it is None (not validated: the public
    functions validate it in ``check_inputs``)."""
    return default_scale(D) if scale is None else float(scale)


_passed = {}   # what check_inputs read of a call that passed -> its resolved scale


def check_inputs(q, k, v, *, scale=None, causal=False, paged=False):
    """Validate q, k, v for the kernels; return the resolved scale. Errors name the argument.
    paged: k and v are a paged cache (num_pages, heads_kv, page_size, headdim), whose first dim is
    not the batch (``flashlib.decode.check_pages`` checks the rest)."""
    # A model passes tensors of the same types, shapes, dtypes and devices at every step, and the
    # checks read nothing else (no values): a call whose key passed before passes again, and gets
    # the scale it got. Types are in the key because True == 1 and 0.5 == np.float64(0.5) hash
    # alike; the device check also reads the interpreter switch and the options' launch hook.
    # Under torch.compile, Dynamo traces the checks themselves.
    key = None
    if not torch.compiler.is_compiling():
        try:
            key = (type(q), type(k), type(v), q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                   q.device, k.device, v.device, type(causal), causal, type(scale), scale, paged,
                   runtime.INTERPRET, runtime.OPTIONS.launch_hook is None)
            found = _passed.get(key)
        except (AttributeError, TypeError):   # not tensors, or unhashable: the checks say what
            key = found = None
        if found is not None:
            return found
    scale = check_tensors(q, k, v, scale=scale, causal=causal, paged=paged)
    if key is not None:
        if len(_passed) >= 1024:   # shapes that keep changing: start again
            _passed.clear()
        _passed[key] = scale
    return scale


def check_tensors(q, k, v, *, scale=None, causal=False, paged=False):
    """``check_inputs``' checks, every one at every call."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    B, Hq, Hkv, Nq, Nk, D = check_qkv(q, k, v, paged=paged)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; expected float16, bfloat16 or float32")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}: use one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    runtime.check_device("q", q)   # k and v are on q's device
    if q.dtype == torch.bfloat16 and q.device.type == "cuda":
        major, minor = runtime.capability(q.device)
        if major < 8:
            raise TypeError(f"q is bfloat16, which needs an sm_80 (Ampere) or newer GPU; this one "
                            f"is sm_{major}{minor} (e.g. Colab's T4): use float16")
    if D > MAX_HEADDIM:
        raise ValueError(f"headdim {D} is over the supported maximum {MAX_HEADDIM}")
    if min(B, Hq, D) == 0:
        raise ValueError(f"q has an empty dimension: shape {tuple(q.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    return check_scale(scale, D)


def check_scale(scale, D: int) -> float:
    """``scale`` validated and resolved: a finite real number, or None for 1/sqrt(D)."""
    if scale is None:
        return default_scale(D)
    if not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite real number, got {scale!r}")
    return float(scale)


def check_qkv(q, k, v, *, paged=False) -> tuple[int, int, int, int, int, int]:
    """Validate SDPA-layout q, k, v; return (B, Hq, Hkv, Nq, Nk, D). Errors name the argument.
    paged: k and v are pages (``check_inputs``); their first dim is not compared with q's batch."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} must have 4 dims (batch, heads, seqlen, headdim), "
                             f"got shape {tuple(t.shape)}")
    B, Hq, Nq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    Bk, Hkv, Nk, Dk = k.shape
    if Bk != B and not paged:
        raise ValueError(f"k has batch {Bk} but q has batch {B}")
    if Dk != D:
        raise ValueError(f"k has headdim {Dk} but q has headdim {D}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"heads_q={Hq} is not a multiple of heads_kv={Hkv}: each key/value "
                         "head must serve a whole group of query heads")
    return B, Hq, Hkv, Nq, Nk, D


def check_score_mods(q, *, softcap=None, alibi_slopes=None, batch=None):
    """Validate the score modifiers for q (B, Hq, ...): ``softcap`` a positive finite float or
    None; ``alibi_slopes`` a float32 tensor (Hq,) or (B, Hq) on q's device with finite values, or
    None (``batch``: B when q is packed, (total, Hq, D)). Returns them as one
    ``kernels.score_mod.Modifiers`` (softcap as a float), ``NO_MODIFIERS`` when both are None."""
    if softcap is None and alibi_slopes is None:
        return NO_MODIFIERS
    if softcap is not None:
        if (isinstance(softcap, bool) or not isinstance(softcap, numbers.Real)
                or not math.isfinite(softcap) or softcap <= 0):
            raise ValueError(f"softcap must be a positive finite number or None, got {softcap!r}")
        softcap = float(softcap)
    if alibi_slopes is not None:
        B, Hq = q.shape[0] if batch is None else batch, q.shape[1]
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got "
                            f"{type(alibi_slopes).__name__}")
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes has dtype {alibi_slopes.dtype}; expected torch.float32")
        if tuple(alibi_slopes.shape) not in ((Hq,), (B, Hq)):
            raise ValueError(f"alibi_slopes must have shape ({Hq},) or ({B}, {Hq}), one slope per "
                             f"query head, got {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q is on {q.device}")
        # read on the host once per version of the tensor (a device sync), eagerly; not while a
        # CUDA graph is captured (no sync is allowed then: the eager warm-up call checked them)
        if (not torch.compiler.is_compiling() and not capturing(alibi_slopes)
                and not all_once([alibi_slopes], _all_finite)):
            raise ValueError("alibi_slopes holds a value that is not finite")
    return Modifiers(softcap, alibi_slopes)


def _all_finite(t):
    return bool(torch.isfinite(t).all())


def capturing(t):
    """Whether a CUDA graph is being captured on t's device's current stream (no sync allowed)."""
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _kept_reads(t):
    """(t's dict of kept host reads, t's version), or None where nothing may be kept: under
    torch.compile, and for inference tensors (no version counter)."""
    if torch.compiler.is_compiling():
        return None
    try:
        version = t._version
    except RuntimeError:               # an inference tensor: no version counter
        return None
    return t.__dict__.setdefault("_flashlib_reads", {}), version


def read_once(t, read):
    """``read(t)``, a host read of t's values, done once per version of the tensor: the read is a
    synchronisation (the GPU drains its queue and idles while the host launches again; measured in
    benchmarks/probes/NOTES.md), and a model passes the same offsets or block table to every
    layer. The result is kept on the tensor, per ``read``, with its version counter, which every
    in-place change through torch bumps; tensors without one (inference mode) and calls under torch.compile read every time."""
    kept = _kept_reads(t)
    if kept is None:
        return read(t)
    reads, version = kept
    cached = reads.get(read)
    if cached is None or cached[0] != version:
        cached = reads[read] = (version, read(t))
    return cached[1]


def all_once(tensors, test):
    """Whether ``test`` (an elementwise check reduced to a bool, such as "all finite") holds for
    every one of ``tensors``, read as ``read_once`` reads: the tensors not yet tested at their
    version are tested together, in one read (one sync) of their values concatenated."""
    pending = []
    for t in tensors:
        kept = _kept_reads(t)
        if kept is None or kept[0].get(test, (None, False)) != (kept[1], True):
            pending.append((t, kept))
    if not pending:
        return True
    if not test(torch.cat([t.reshape(-1) for t, _ in pending])):
        return False
    for t, kept in pending:
        if kept is not None:
            kept[0][test] = (kept[1], True)
    return True


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, scale=None,
                 causal=False):
    """Validate packed (varlen) inputs: q (total_q, Hq, D), k, v (total_k, Hkv, D), int32 offsets
    (batch + 1,) from 0, non-decreasing, ending at the tensors' lengths, and max_seqlen_* at least
    the longest sequence. Returns the resolved scale. The offsets are read on the host (a device
    sync on a GPU, once per version of the tensor: ``read_once``): wrong ones would read another
    sequence's rows, so they are always checked."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 3:
            raise ValueError(f"{name} must have 3 dims (total_tokens, heads, headdim): sequences "
                             f"packed one after another; got shape {tuple(t.shape)}")
    # the SDPA-layout checks (dtypes, devices, heads, headdim) on (1, heads, tokens, headdim) views
    scale = check_inputs(*(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)), scale=scale,
                         causal=causal)
    lengths = {}
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]),
                            ("cu_seqlens_k", cu_seqlens_k, k.shape[0])):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.ndim != 1 or cu.numel() < 2:
            raise TypeError(f"{name} must be an int32 tensor of shape (batch + 1,), got "
                            f"{cu.dtype} of shape {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name} is on {cu.device} but q is on {q.device}")
        offsets = read_once(cu, torch.Tensor.tolist)
        steps = [b - a for a, b in zip(offsets, offsets[1:])]
        if offsets[0] != 0 or min(steps) < 0 or offsets[-1] != total:
            raise ValueError(f"{name} must start at 0, never decrease and end at {total} (the "
                             f"tokens of {name[-1]}), got {offsets[:8]}{' ...' if len(offsets) > 8 else ''}")
        lengths[name] = steps
    if len(lengths["cu_seqlens_q"]) != len(lengths["cu_seqlens_k"]):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k describe {len(lengths['cu_seqlens_q'])} "
                         f"and {len(lengths['cu_seqlens_k'])} sequences; they must agree")
    for name, value, side in (("max_seqlen_q", max_seqlen_q, "cu_seqlens_q"),
                              ("max_seqlen_k", max_seqlen_k, "cu_seqlens_k")):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < max(lengths[side]):
            raise ValueError(f"{name}={value} is less than the longest sequence in {side}, "
                             f"{max(lengths[side])}")
    return scale
