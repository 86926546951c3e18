"""Exercise 00 (lesson 00, GPU primer): the roofline model.

A kernel must do ``flops`` floating-point operations and move ``bytes_moved`` bytes between
HBM and the chip. The GPU does at most ``peak_flops`` operations per second and moves at most
``bandwidth`` bytes per second, and it does both at the same time (loads overlap with math).
So the work takes at least

    max(flops / peak_flops, bytes_moved / bandwidth)  seconds,

and the larger term names the bound: "compute" when the math takes longer, "memory" when the
bytes do. Said with arithmetic intensity (flops per byte, flops / bytes_moved): work above the
ridge point peak_flops / bandwidth is compute-bound, work below it memory-bound.

Example, H100 SXM (989e12 bf16 flop/s, 3.35e12 B/s, ridge point about 295 flop/B):
adding two float32 vectors of 1e8 elements does 1e8 flops and moves 1.2e9 bytes (read a and
b, write c): intensity 0.083 flop/B, memory-bound, at least 0.36 ms.

Write ``roofline`` below; then run ``flashlib check ex00``.
"""


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    """The least time the work can take, and what bounds it.

    flops: floating-point operations to do (> 0).
    bytes_moved: bytes read from and written to HBM (> 0).
    peak_flops: the GPU's peak, in flop/s. bandwidth: HBM bandwidth, in bytes/s.
    Returns (seconds, bound): seconds is a float, bound is "compute" or "memory" (exactly these
    words). At the ridge point itself, where both times are equal, either word is accepted.
    """
    raise NotImplementedError('ex00: your code goes here, then run `flashlib check ex00`')
