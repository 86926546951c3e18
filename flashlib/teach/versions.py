"""Checking and timing the numbered kernel versions, llm.c style: each checked, then timed.

As in llm.c's ``dev/cuda/attention_forward.cu``, every dense forward kernel the course builds has a
number and one line saying what it changed (the registry, ``VERSIONS``, is the core's:
``flashlib.kernels.dispatch``, which also picks the version each call runs); ``check_version(n)``
validates version n against the float64 oracle on irregular shapes, and ``time_version(n)`` (GPU
only) runs that check at the timed shape first, then times it with ``triton.testing.do_bench``.
Every version's forward takes ``(q, k, v, *, causal=False, scale=None) -> (out, lse)``.

    1  fa1_forward (lesson 06): FlashAttention-1, Algorithm 1. One program per (batch, head);
       key/value blocks outer, query blocks inner; O, l, m re-read and re-written in HBM every step.
    2  fa2_forward (lesson 07): FlashAttention-2. Query blocks outer, one program per (query block,
       batch, head); state in registers, normalised once at the end; causal blocks skipped.
    3  fa3_forward (lesson 12): FlashAttention-3 on Hopper, in Gluon. TMA loads by a producer warp
       into a ring of shared-memory stages, two consumer warpgroups on async wgmma taking turns
       (ping-pong), each block's softmax overlapped with the next block's matmul. sm90 only,
       float16/bfloat16, head dims 64 and 128 (``available(3)``).

What each measured is not written here: numbers depend on the GPU. Lesson 06 times 1 against 2
on the GPU it runs on (``time_version``); ``python -m flashlib.bench`` times version 2 against PyTorch.
"""
import torch

from .. import runtime
from ..kernels import fa3_fwd
from ..kernels.dispatch import VERSIONS, attention_flops
from ..testing import assert_attention_close

# (B, Hq, Hkv, Nq, Nk, D, causal): N not a multiple of any block, Nq != Nk, head dim 80,
# 9 heads, grouped heads, causal with Nq > Nk (rows with no key) and Nq < Nk
CHECK_SHAPES = [
    (1, 2, 2, 130, 97, 64, False),
    (2, 9, 3, 17, 130, 80, True),
    (1, 2, 1, 130, 33, 80, True),
    (1, 1, 1, 1, 97, 16, False),
]


# version 3 runs head dims 64 and 128 in 16-bit only: the same cases at those head dims
HOPPER_CHECK_SHAPES = [(1, 2, 2, 130, 97, 64, False), (2, 8, 2, 17, 130, 128, True),
                       (1, 2, 1, 130, 33, 64, True), (1, 1, 1, 1, 97, 128, False)]


def available(n) -> bool:
    """Whether version n runs here: 1 and 2 everywhere (the CPU through the interpreter), 3 on an
    sm90 GPU with the Triton release its Gluon code is written for."""
    if n != 3:
        return n in VERSIONS
    probe = torch.empty(1, 1, 16, 64, dtype=torch.float16, device=runtime.DEVICE)
    return fa3_fwd.supported(probe, probe, probe)


def forward_of(n):
    """Version n's forward launcher; a clear error for an unknown number or one that cannot run here."""
    if n not in VERSIONS:
        raise ValueError(f"unknown kernel version {n!r}; known: {sorted(VERSIONS)}")
    if not available(n):
        raise RuntimeError(f"version {n} needs an sm90 GPU (H100/H200) and Triton "
                           f"{fa3_fwd.TESTED_TRITON[0]}x (its Gluon API); this machine has "
                           f"{runtime.gpu_name()}: use version 2")
    return VERSIONS[n].forward


def check_version(n, *, shapes=None, dtype=None, scale=None):
    """Validate version ``n`` against attention_ref; raise AssertionError if it is off.

    shapes: (B, Hq, Hkv, Nq, Nk, D, causal) tuples, default ``CHECK_SHAPES``; dtype: default
    float16 on a GPU, float32 on the CPU. Fresh random inputs each call. Returns the max error
    of out for each shape (the tolerance is flashlib.testing's: 2x naive attention's error).
    """
    fn = forward_of(n)
    shapes = (HOPPER_CHECK_SHAPES if n == 3 else CHECK_SHAPES) if shapes is None else shapes
    dtype = (torch.float16 if runtime.DEVICE.type == "cuda" else torch.float32) if dtype is None else dtype
    errors = []
    for B, Hq, Hkv, Nq, Nk, D, causal in shapes:
        q = torch.randn(B, Hq, Nq, D, dtype=dtype, device=runtime.DEVICE)
        k, v = (torch.randn(B, Hkv, Nk, D, dtype=dtype, device=runtime.DEVICE) for _ in range(2))
        out, lse = fn(q, k, v, causal=causal, scale=scale)
        what = f"version {n}, {str(dtype).removeprefix('torch.')} {(B, Hq, Hkv, Nq, Nk, D)} causal={causal}"
        errors.append(assert_attention_close(out, lse, q, k, v, causal=causal, scale=scale, name=what))
    return errors


def time_version(n, *, B=4, H=16, N=4096, D=64, causal=False, dtype=torch.float16):
    """GPU only: check version ``n`` (irregular shapes and one head pair at length N), then time
    it at (B, H, N, D) with do_bench. Returns {"version", "ms", "tflops", ...}."""
    import triton.testing

    if runtime.DEVICE.type != "cuda":
        raise RuntimeError("time_version needs a CUDA GPU: timings through the interpreter are "
                           "meaningless (use check_version on the CPU)")
    fn = forward_of(n)
    check_version(n, dtype=dtype)
    check_version(n, shapes=[(1, 2, 2, N, N, D, causal)], dtype=dtype)
    q, k, v = (torch.randn(B, H, N, D, dtype=dtype, device=runtime.DEVICE) for _ in range(3))
    ms = triton.testing.do_bench(lambda: fn(q, k, v, causal=causal))
    tflops = attention_flops(B, H, N, N, D, causal=causal) / (ms * 1e-3) / 1e12
    return {"version": n, "impl": fn.__name__, "B": B, "H": H, "N": N, "D": D, "causal": causal,
            "dtype": str(dtype).removeprefix("torch."), "ms": ms, "tflops": tflops}
