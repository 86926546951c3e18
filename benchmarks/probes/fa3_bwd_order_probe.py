"""FA3's backward with dQ's first slice issued before dK (the ``fa3_dq_before_dk`` option) and without,
in one process, beside SDPA cuDNN's backward.

At the backward suite's shapes (``flashlib.bench.harness.FORWARD_SHAPES``: B x N = 32k tokens,
H x D = 2048), float16: out and lse from ``fa3_fwd.fa3_forward``, then ``fa3_bwd.fa3_backward``
with the flag on and off (the flag is in the launch plans' key) and cuDNN's backward (autograd on
SDPA's cuDNN backend, its forward run before the timed backward), in rounds that alternate the
order. First, at each shape: both arms' dk and dv bit-equal and dq equal up to the order of its
reduce-adds (the GPU tests, tests/test_fa3_bwd.py, check the kernel against the float64 oracle).

    FLASHLIB_AUTOTUNE=0 python benchmarks/probes/fa3_bwd_order_probe.py [--rounds=3]
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlib
from flashlib.bench.harness import FORWARD_SHAPES, time_ms, make_inputs, shape_for
from flashlib.kernels import fa3_bwd, fa3_fwd

ROUNDS = next((int(a.split('=')[1]) for a in sys.argv[1:] if a.startswith('--rounds=')), 3)


def with_order(dq_first, call):
    def run():
        with flashlib.kernel_options(fa3_dq_before_dk=dq_first):
            return call()
    return run


def main():
    print(torch.cuda.get_device_name(), torch.__version__, f"rounds {ROUNDS}")
    print(f"{'shape':<24} {'arm':<14} {'median ms':>9} {'vs cuDNN':>8}  rounds")
    for D, N, causal in FORWARD_SHAPES:
        s = shape_for(D, N)
        q, k, v = make_inputs(s["B"], s["Hq"], s["Hkv"], N, N, D, torch.float16, "cuda")
        dout = torch.randn_like(q)
        out, lse = fa3_fwd.fa3_forward(q, k, v, causal=causal)
        arms = {f"dq_first={on}": with_order(on, lambda: fa3_bwd.fa3_backward(q, k, v, out, lse, dout, causal=causal))
                for on in (True, False)}
        first, second = (arm() for arm in arms.values())
        assert all(torch.equal(a, b) for a, b in zip(first[1:], second[1:])), "dk, dv differ between orders"
        assert torch.allclose(first[0], second[0], rtol=1e-2, atol=1e-3), "dq differs between orders"
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref_out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        arms["cudnn bwd"] = lambda: torch.autograd.grad(ref_out, (qg, kg, vg), dout, retain_graph=True)
        times = {name: [] for name in arms}
        for r in range(ROUNDS):
            for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                times[name].append(time_ms(arms[name]))
        tag = f"B{s['B']} H{s['Hq']} N{N} d{D}{' c' if causal else ''}"
        base = statistics.median(times["cudnn bwd"])
        for name, ms in times.items():
            med = statistics.median(ms)
            print(f"{tag:<24} {name:<14} {med:>9.3f} {base / med:>8.3f}  {' '.join(f'{m:.3f}' for m in ms)}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
