"""Why does FP8's one-consumer variant not finish causal at d64? Cases side by side, each
in its own process under a timeout: three synchronised calls, seconds each.

    PYTHONPATH=$PWD python benchmarks/probes/fp8_hang_repro.py            (all cases; --last: the CTA-count ones)
    PYTHONPATH=$PWD python benchmarks/probes/fp8_hang_repro.py B H N D CAUSAL(0|1) VARIANT DTYPE(fp8|fp16) KEY_ORDER(0|1)

On an H200 the `simple` variant did not finish d64 causal B8 H32 N4096 in two runs, and took
0.39 s a call at B1 H4 N4096 (NOTES.md, twelfth session). The cases vary one thing at a time:
the mask, the CTA count (32 CTAs on 132 SMs: one an SM), the head dim (d128's 156 KB of shared
memory leaves room for one CTA an SM, d64's 78 KB for two), the dtype and V^T's key order.
--two-an-sm: fp16 with fewer stages (two CTAs an SM), and causal CTAs of equal work (Nq = 64).
Ruled out since (h100/fp8_hang_repro_producer.log, fp8_hang_repro_fence.log): the producer as a
whole warpgroup instead of one warp (at 593b4e7), and a proxy fence after the mbarrier inits
(kept: the CUDA guide's TMA pattern). Both still hang causal at B1 H3.
"""
import subprocess
import sys
import time
from pathlib import Path

CASES = [  # B H N D causal variant dtype key_order
    (1, 4, 4096, 64, 1, "simple", "fp8", 1),
    (1, 4, 4096, 64, 0, "simple", "fp8", 1),
    (1, 1, 4096, 64, 1, "simple", "fp8", 1),
    (1, 4, 4096, 128, 1, "simple", "fp8", 1),
    (1, 4, 4096, 64, 1, "simple", "fp16", 1),
    (1, 4, 4096, 64, 1, "simple", "fp8", 0),
    (1, 4, 4096, 64, 1, "2wg", "fp8", 1),
    (1, 2, 4096, 64, 1, "simple", "fp8", 1),   # 128 CTAs on 132 SMs
    (1, 3, 4096, 64, 1, "simple", "fp8", 1),   # 192: some SMs get two
    (1, 8, 4096, 64, 0, "simple", "fp8", 1),   # 512 CTAs, non-causal: two an SM, four waves
]
if len(sys.argv) > 1 and sys.argv[1] == "--two-an-sm":   # ... Nq (0: N), shared memory (0: all)
    CASES, sys.argv = [(1, 3, 4096, 64, 1, "simple", "fp16", 1, 0, 100000),   # fp16, 2 stages: two an SM
                       (1, 8, 4096, 64, 0, "simple", "fp16", 1, 0, 100000),
                       (1, 264, 4096, 64, 1, "simple", "fp8", 1, 64, 0)], sys.argv[:1]   # equal CTAs
if len(sys.argv) > 1 and sys.argv[1] == "--last":   # only the cases after the first seven
    CASES, sys.argv = CASES[7:], sys.argv[:1]


def one(B, H, N, D, causal, variant, dtype, key_order, nq=0, smem_bytes=0):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import torch
    from flashlib import fp8
    from flashlib.kernels import fa3_fwd
    from flashlib import runtime
    # less shared memory: fewer stages, more CTAs an SM
    options = runtime.OPTIONS.replace(fa3_smem_bytes=smem_bytes) if smem_bytes else None
    q, k, v = (torch.randn(B, H, n, D, device="cuda", dtype=torch.float16) for n in (nq or N, N, N))
    if dtype == "fp8":
        (q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(t, H) for t in (q, k, v))
        call = lambda: fa3_fwd.fa3_forward_fp8(q8, k8, v8, torch.stack([qd, kd, vd]), causal=causal,
                                               variant=variant, options=options, key_order=bool(key_order),
                                               one_consumer_causal=True)
    else:
        call = lambda: fa3_fwd.fa3_forward(q, k, v, causal=causal, variant=variant, options=options)
    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        t = time.time()
        call()
        torch.cuda.synchronize()
        times.append(time.time() - t)
    print(" ".join(f"{x:.4f}s" for x in times), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        a = sys.argv[1:]
        one(*map(int, a[:5]), a[5], a[6], *map(int, a[7:]))
    else:
        for case in CASES:
            tag = "B{} H{} N{} d{} causal={} {} {} key_order={}".format(*case)
            tag += " Nq={} smem={}".format(*case[8:]) if len(case) > 8 else ""
            try:
                r = subprocess.run([sys.executable, __file__, *map(str, case)], capture_output=True,
                                   text=True, timeout=60)
                print(f"{tag:<52} {r.stdout.strip() or r.stderr.strip()[-300:]}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{tag:<52} did not finish in 60 s", flush=True)
