"""Does fa3_forward_fp8 finish? Three calls at one shape and variant, each synchronised and timed.

    python benchmarks/fp8_hang_repro.py B H N CAUSAL(0|1) VARIANT      (run it under `timeout`)

On an H200 the `simple` variant did not finish d64 causal B8 H32 N4096 in two runs (NOTES.md,
twelfth session); this narrows it down.
"""
import sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
from flashlib import fp8  # noqa: E402
from flashlib.kernels import fa3_fwd  # noqa: E402
B, H, N, causal, variant = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
q, k, v = (torch.randn(B, H, N, 64, device="cuda", dtype=torch.float16) for _ in range(3))
(q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(t, H) for t in (q, k, v))
d = torch.stack([qd, kd, vd])
t = time.time()
for i in range(3):
    out, lse = fa3_fwd.fa3_forward_fp8(q8, k8, v8, d, causal=causal, variant=variant)
    torch.cuda.synchronize()
    print(B, H, N, causal, variant, f"call {i}: {time.time() - t:.3f}s", flush=True)
