"""Probe: the FA3 backward's variants on packed sequences (cu_seqlens), alternating rounds (issue 57).

Packed batches of 32k tokens in sequences of 1k-7k (seeded), 2048 / D heads, float16, causal and
not: each variant's backward (``fa3_bwd.fa3_backward`` with ``cu_seqlens``) timed in turn with
``triton.testing.do_bench``, medians over ``--rounds``. Correctness of every variant on packed
sequences is tests/test_fa3_bwd.py's ``test_gpu_packed_sequences``; this only times.

    PYTHONPATH=$PWD FLASHLIB_AUTOTUNE=0 python benchmarks/probes/fa3_bwd_packed_ab.py [--rounds 3]
"""
import argparse
import statistics

import torch
import triton

from fa3_bwd_split_ab import alternate
from flashlib.kernels import fa3_bwd
from flashlib.kernels.fa3_fwd import fa3_forward


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="2wg,2wg_split")
    args = ap.parse_args()
    variants = args.variants.split(",")
    gen = torch.Generator().manual_seed(0)
    lengths = []
    while sum(lengths) < 32768 - 7168:
        lengths.append(int(torch.randint(1024, 7168, (1,), generator=gen)))
    lengths.append(32768 - sum(lengths))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"sequences {lengths}")
    for D in (64, 128):
        H = 2048 // D
        for causal in (False, True):
            q, k, v, dout = (torch.randn(32768, H, D, device="cuda", dtype=torch.float16) for _ in range(4))
            packed = dict(cu_seqlens=(cu, cu), max_seqlen=(max(lengths), max(lengths)))
            out, lse = fa3_forward(q, k, v, causal=causal, **packed)
            runs = {variant: (lambda variant=variant: fa3_bwd.fa3_backward(
                q, k, v, out, lse, dout, causal=causal, variant=variant, **packed)) for variant in variants
                if D in fa3_bwd.VARIANTS[variant].head_dims}
            times = alternate(runs, args.rounds)
            flops = 2.5 * 4 * H * D * sum(n * n for n in lengths) / (2 if causal else 1)
            print(f"d{D} H{H} {'causal' if causal else 'full':6} " + "  ".join(
                f"{name} {statistics.median(t):.3f} ms {flops / statistics.median(t) * 1e-9:.0f} TFLOP/s"
                for name, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
