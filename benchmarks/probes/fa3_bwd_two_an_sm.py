"""Do the FA3 backward's one-consumer variants finish causal with two CTAs on an SM?

FP8's one-consumer forward does not (benchmarks/probes/fp8_hang_repro.py); the backward's one-consumer
variants (``simple``, ``1wg``, ``1wg_keys_m``: 99-115 KB of shared memory, 128 registers a
thread) leave room for two CTAs an SM too, and their GPU tests launch 96 CTAs (one an SM). Each
case in its own process under a timeout: causal B1 Hkv=Hq=8 N4096 d64 (512 CTAs of 64 keys,
unequal work), gradients compared with the default variant's.

    PYTHONPATH=$PWD python benchmarks/probes/fa3_bwd_two_an_sm.py
"""
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("simple", "1wg", "1wg_keys_m")


def one(variant):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import torch
    from flashlib.kernels import fa3_bwd, fa3_fwd
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 8, 4096, 64, device="cuda", dtype=torch.float16) for _ in range(4))
    out, lse = fa3_fwd.fa3_forward(q, k, v, causal=True)
    ref = fa3_bwd.fa3_backward(q, k, v, out, lse, do, causal=True)
    took = []
    for _ in range(2):   # the first call compiles the variant, the second is a launch alone
        torch.cuda.synchronize()
        start = time.time()
        got = fa3_bwd.fa3_backward(q, k, v, out, lse, do, causal=True, variant=variant)
        torch.cuda.synchronize()
        took.append(time.time() - start)
    err = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(got, ref))
    print(f"finished: {took[0]:.3f} s with its compile, {took[1] * 1e3:.2f} ms warm; largest error against "
          f"the default variant {err:.2e} (relative to the gradient's largest)", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(sys.argv[1])
    else:
        for variant in VARIANTS:
            try:
                r = subprocess.run([sys.executable, __file__, variant], capture_output=True, text=True,
                                   timeout=60)
                print(f"{variant:<12} {r.stdout.strip() or r.stderr.strip()[-300:]}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{variant:<12} did not finish in 60 s", flush=True)
