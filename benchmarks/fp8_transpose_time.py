"""The FP8 forward's V^T on a GPU: torch's strided copy of 1-byte elements against the tiled
Triton kernel ``kernels/fa3_fwd.transpose_rows`` at the FP8 suite's shapes (bytes equal first).

    python benchmarks/fp8_transpose_time.py
"""
import torch, triton
from flashlib.kernels.fa3_fwd import transpose_rows
print(torch.cuda.get_device_name())
for B, H, N, D in [(8, 32, 4096, 64), (2, 32, 16384, 64), (8, 16, 4096, 128), (2, 16, 16384, 128)]:
    v = torch.randn(B, H, N, D, device="cuda").to(torch.float8_e4m3fn)
    w = -(-N // 16) * 16
    def old():
        t = torch.empty((B, H, D, w), dtype=v.dtype, device="cuda"); t[..., :N].copy_(v.transpose(2, 3)); return t
    assert torch.equal(old()[..., :N].view(torch.uint8), transpose_rows(v, w)[..., :N].view(torch.uint8))
    a, b = triton.testing.do_bench(old), triton.testing.do_bench(lambda: transpose_rows(v, w))
    print(f"B{B} H{H} N{N} d{D}: torch strided copy {a:.3f} ms, transpose_rows {b:.3f} ms ({2 * v.numel() / b / 1e9:.2f} TB/s)", flush=True)
