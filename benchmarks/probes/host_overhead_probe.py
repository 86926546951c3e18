"""Probe: flashlib's host (Python) time per call on a CPU, with the kernels' launches skipped.

The GPU path's host work, run on any machine: the launch layer is told it may launch directly
(``launch.SUPPORTED``, as on a GPU with a tested Triton), and a launch of a kernel returns a
stand-in for Triton's compiled kernel whose C entry point does nothing. So every call runs what
it runs on a GPU (checks, options, the autograd Function, dispatch, allocations, plan keys and
replays, ``fast_launch``'s signature) except the driver's launch and the CUDA allocator; the
patches live in this script only. The numbers are CPU-only stand-ins: a GPU host adds the
launches (several us each) and slower allocations, and its CPU may be slower or faster.

Paths, us per call (best of 5 loops of ``--calls``, autograd's backward on the calling thread):
- ``flash_attention`` forward (no grad), forward+backward (q, k, v requiring grad, causal), at a
  small GPT-2-like shape, float16 and bfloat16;
- one decoding step as ``teach/gpt.py``'s ``attend`` makes it, ``KVCache.attend(q, k, v)`` (the
  append inside the decoding launch, ``decode_append``), and the same step as ``KVCache.append``
  of the new token's k, v, then ``KVCache.attend`` (``flash_decode`` with ``cache_seqlens``), B 1
  and 8;
- floors: an empty ``autograd.Function`` that allocates what flashlib's does (fwd+bwd), and
  two tensor copies plus ``torch.empty`` (the decode step's unavoidable torch work).

    python benchmarks/probes/host_overhead_probe.py [--calls 2000]   (CPU only: Triton's interpreter)
"""
import argparse
import contextlib
import time
import types
from unittest import mock

import torch

import flashlib   # before triton: it turns the interpreter on where there is no GPU
from flashlib.decode import KVCache
from flashlib.kernels import launch
from triton.runtime.interpreter import InterpretedFunction


class SkippedLauncher:
    """Triton 3.6's compiled launcher as ``launch._record`` reads it, launching nothing."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = 0, 0

    def launch(self, *args):
        pass


SKIPPED = types.SimpleNamespace(run=SkippedLauncher(), function=0, packed_metadata=(4, 1, 0))


@contextlib.contextmanager
def launches_skipped():
    """The GPU path with every kernel launch skipped (see the module docstring)."""
    driver = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 0)
    params = property(lambda kernel: [types.SimpleNamespace(name=n) for n in kernel.arg_names])
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(launch, "SUPPORTED", True))
        stack.enter_context(mock.patch.object(launch, "_driver", lambda: driver))
        stack.enter_context(mock.patch.object(InterpretedFunction, "__getitem__",
                                              lambda kernel, grid: lambda *a, **k: SKIPPED))
        stack.enter_context(mock.patch.object(InterpretedFunction, "params", params, create=True))
        yield


def us_per_call(fn, calls):
    for _ in range(min(calls, 200)):
        fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls / 1e3)
    return best


class EmptyAttention(torch.autograd.Function):
    """The floor: an autograd node allocating flashlib's outputs and gradients, and nothing else."""
    @staticmethod
    def forward(ctx, q, k, v):
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        torch.empty_like(lse)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def attention_paths(dtype, calls):
    B, Hq, Hkv, T, D = 1, 12, 12, 64, 64        # GPT-2's heads and head dim, a short sequence
    q = torch.randn(B, Hq, T, D, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(B, Hkv, T, D, dtype=dtype, requires_grad=True) for _ in range(2))
    dout = torch.randn_like(q)

    def forward():
        with torch.no_grad():
            flashlib.flash_attention(q, k, v, causal=True)

    def backward(out):
        q.grad = k.grad = v.grad = None   # as an optimizer's zero_grad: no accumulation on the CPU
        out.backward(dout)

    rows = {"flash_attention forward (no grad)": us_per_call(forward, calls),
            "flash_attention forward+backward": us_per_call(
                lambda: backward(flashlib.flash_attention(q, k, v, causal=True)), calls),
            "floor: empty autograd.Function fwd+bwd": us_per_call(
                lambda: backward(EmptyAttention.apply(q, k, v)[0]), calls)}
    return {f"{name}, {str(dtype)[6:]}": value for name, value in rows.items()}


def decode_paths(batch, calls):
    Hq, Hkv, D, prompt, max_len = 12, 12, 64, 512, 4096
    cache = KVCache(batch, Hkv, max_len, D, dtype=torch.float16)
    k_new, v_new = (torch.randn(batch, Hkv, 1, D, dtype=torch.float16) for _ in range(2))
    q_new = torch.randn(batch, Hq, 1, D, dtype=torch.float16)
    cache.append(*(torch.randn(batch, Hkv, prompt, D, dtype=torch.float16) for _ in range(2)))
    # the skipped launches write no lengths: the buffer an appending launch would fill holds valid
    # ones (the CPU path checks cache_seqlens' values)
    cache._next_seqlens = cache.seqlens.clone()

    def refill():
        if cache.lengths[0] == max_len:
            cache.reset()
            cache.append(*(torch.randn(batch, Hkv, prompt, D, dtype=torch.float16) for _ in range(2)))

    def step():   # teach/gpt.py's attend at a decoding step
        refill()
        cache.attend(q_new, k_new, v_new)

    def append_then_attend():
        refill()
        with_plain_append = {"decode_append": False}
        cache.append(k_new, v_new)
        cache.attend(q_new, kernel_options=with_plain_append)

    k, v = cache.k, cache.v

    def floor():
        k[:, :, 7:8] = k_new
        v[:, :, 7:8] = v_new
        torch.empty_like(q_new)

    return {f"decode step (KVCache.attend(q, k, v)), B{batch}": us_per_call(step, calls),
            f"decode step (KVCache.append + attend), B{batch}": us_per_call(append_then_attend, calls),
            f"floor: two cache writes + torch.empty, B{batch}": us_per_call(floor, calls)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    if not flashlib.runtime.INTERPRET:
        raise SystemExit("this probe stands in for a GPU on a CPU (the interpreter's kernels); "
                         "on a GPU, time the real launches: benchmarks/probes/host_time_probe.py")
    torch.autograd.set_multithreading_enabled(False)
    torch.set_num_threads(1)
    print(f"host us per call, launches skipped, torch {torch.__version__}, CPU stand-in for the GPU path")
    with launches_skipped():
        rows = {}
        for dtype in (torch.float16, torch.bfloat16):
            rows.update(attention_paths(dtype, args.calls))
        for batch in (1, 8):
            rows.update(decode_paths(batch, args.calls))
    for name, value in rows.items():
        print(f"  {name:55} {value:7.1f}")


if __name__ == "__main__":
    main()
