"""The FP8 forward's V^T on a GPU: torch's strided copy of 1-byte elements against the tiled
Triton kernel ``kernels/fa3_fwd.transpose_rows`` at the FP8 suite's shapes (bytes equal first),
and the kernel with the keys in P's register order (``key_order``, the FP8 forward's default).

    python benchmarks/probes/fp8_transpose_time.py
"""
import torch
import triton

from flashlib.kernels.fa3_fwd import transpose_rows

print(torch.cuda.get_device_name())
for B, H, N, D in [(8, 32, 4096, 64), (2, 32, 16384, 64), (8, 16, 4096, 128), (2, 16, 16384, 128)]:
    v = torch.randn(B, H, N, D, device="cuda").to(torch.float8_e4m3fn)
    width = -(-N // 16) * 16

    def strided_copy():
        out = torch.empty((B, H, D, width), dtype=v.dtype, device="cuda")
        out[..., :N].copy_(v.transpose(2, 3))
        return out

    assert torch.equal(strided_copy()[..., :N].view(torch.uint8), transpose_rows(v, width)[..., :N].view(torch.uint8))
    old, new = triton.testing.do_bench(strided_copy), triton.testing.do_bench(lambda: transpose_rows(v, width))
    keyed = triton.testing.do_bench(lambda: transpose_rows(v, -(-N // 32) * 32, key_order=True))
    print(f"B{B} H{H} N{N} d{D}: torch strided copy {old:.3f} ms, transpose_rows {new:.3f} ms "
          f"({2 * v.numel() / new / 1e9:.2f} TB/s), in key order {keyed:.3f} ms", flush=True)
