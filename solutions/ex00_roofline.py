"""Exercise 00 (lesson 00, GPU primer; part 2 in lesson 05): the roofline model, and occupancy.

Part 1, ``roofline`` (lesson 00). A kernel must do ``flops`` floating-point operations and move
``bytes_moved`` bytes between HBM and the chip. The GPU does at most ``peak_flops`` operations
per second and moves at most ``bandwidth`` bytes per second, and it does both at the same time
(loads overlap with math). So the work takes at least

    max(flops / peak_flops, bytes_moved / bandwidth)  seconds,

and the larger term names the bound: "compute" when the math takes longer, "memory" when the
bytes do. Said with arithmetic intensity (flops per byte, flops / bytes_moved): work above the
ridge point peak_flops / bandwidth is compute-bound, work below it memory-bound.

Example, H100 SXM (989e12 bf16 flop/s, 3.35e12 B/s, ridge point about 295 flop/B):
adding two float32 vectors of 1e8 elements does 1e8 flops and moves 1.2e9 bytes (read a and
b, write c): intensity 0.083 flop/B, memory-bound, at least 0.36 ms.

Part 2, ``occupancy`` (lesson 05, where you read a compiled kernel's registers and shared memory):
how many programs (thread blocks) of a kernel one streaming multiprocessor (SM) holds at once,
each limited by the SM's registers, shared memory, warp slots and block slots, and the fraction
of its warp slots they fill. The rules are in its docstring; ``H100`` and the other dicts below
hold the limits.

Write ``roofline`` below (lesson 00), then ``occupancy`` (lesson 05); run ``flashlib check ex00``
after each (until ``occupancy`` is written its checks say "todo").
"""


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    """The least time the work can take, and what bounds it.

    flops: floating-point operations to do (> 0).
    bytes_moved: bytes read from and written to HBM (> 0).
    peak_flops: the GPU's peak, in flop/s. bandwidth: HBM bandwidth, in bytes/s.
    Returns (seconds, bound): seconds is a float, bound is "compute" or "memory" (exactly these
    words). At the ridge point itself, where both times are equal, either word is accepted.
    """
    # BEGIN SOLUTION
    compute_time = flops / peak_flops        # seconds if the math were all there was
    memory_time = bytes_moved / bandwidth    # seconds if moving the bytes were all there was
    bound = "compute" if compute_time >= memory_time else "memory"
    return max(compute_time, memory_time), bound
    # END SOLUTION


# Per-SM limits of four GPUs (NVIDIA's CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability"; the allocation units and sub-partitions are the CUDA occupancy
# calculator's). Spec values, not measurements. Sizes in bytes.
H100 = dict(name="H100 / H200 (sm90)", registers_per_sm=65536, register_unit=256, sub_partitions=4,
            max_warps_per_sm=64, max_blocks_per_sm=32, shared_per_sm=228 * 1024,
            shared_per_block=227 * 1024, reserved_shared_per_block=1024, shared_unit=128)
A100 = dict(name="A100 (sm80)", registers_per_sm=65536, register_unit=256, sub_partitions=4,
            max_warps_per_sm=64, max_blocks_per_sm=32, shared_per_sm=164 * 1024,
            shared_per_block=163 * 1024, reserved_shared_per_block=1024, shared_unit=128)
L4 = dict(name="L4 (sm89)", registers_per_sm=65536, register_unit=256, sub_partitions=4,
          max_warps_per_sm=48, max_blocks_per_sm=24, shared_per_sm=100 * 1024,
          shared_per_block=99 * 1024, reserved_shared_per_block=1024, shared_unit=128)
T4 = dict(name="T4 (sm75)", registers_per_sm=65536, register_unit=256, sub_partitions=4,
          max_warps_per_sm=32, max_blocks_per_sm=16, shared_per_sm=64 * 1024,
          shared_per_block=64 * 1024, reserved_shared_per_block=0, shared_unit=256)


def occupancy(num_warps, registers_per_thread, shared_bytes, sm):
    """How many programs (thread blocks) of a kernel one SM holds at once, and its occupancy.

    num_warps: warps per program (Triton's num_warps, >= 1). registers_per_thread: 32-bit
    registers the compiler gave each thread (Triton's n_regs, 1 to 255). shared_bytes: shared
    memory per program in bytes (Triton's metadata.shared, >= 0). sm: a dict of one SM's limits,
    as H100 above (read every figure from it: the grader tries other GPUs).

    Each resource alone allows some number of blocks (the rules of NVIDIA's CUDA occupancy
    calculator; every division here rounds down, except where it says "rounded up"):

    - "registers": a warp needs registers_per_thread x 32 registers, rounded up to a multiple of
      sm["register_unit"] (256: registers are handed to a warp in chunks). The register file
      (sm["registers_per_sm"], 65536) is split evenly into sm["sub_partitions"] (4) parts, and
      each warp takes all its registers from one part: a part holds (65536 / 4) / (registers per
      warp) warps, the SM 4 times that, and the blocks are those warps / num_warps.
    - "shared memory": a block needs shared_bytes plus sm["reserved_shared_per_block"] (1 KB
      that the CUDA runtime keeps for itself), rounded up to a multiple of sm["shared_unit"]
      (128 bytes); the blocks are sm["shared_per_sm"] (228 KB on an H100: what the whole SM has)
      / that. Do not divide sm["shared_per_block"] (227 KB): that is the most one block may ask
      for, not what the SM holds. A block that needs 0 bytes (possible only where the reserve
      is 0) is not limited by shared memory: use sm["max_blocks_per_sm"] for it.
    - "warps": sm["max_warps_per_sm"] (64 warp slots on an H100) / num_warps.
    - "blocks": sm["max_blocks_per_sm"] (32 on an H100).

    Returns (blocks_per_sm, occupancy, limits): limits is a dict with exactly those four keys,
    each the int number of blocks that limit alone allows; blocks_per_sm is the smallest of
    them (0 means the kernel cannot launch on this GPU); occupancy is the fraction of the SM's
    warp slots the resident blocks fill, blocks_per_sm x num_warps / sm["max_warps_per_sm"].

    Example, H100, 4 warps, 168 registers, 64 KB of shared memory: a warp takes 168 x 32 = 5376
    registers (already a multiple of 256), a part holds 16384 // 5376 = 3 warps, the SM 12, so
    3 blocks; a block takes 65536 + 1024 = 66560 bytes, 233472 // 66560 = 3 blocks; warps allow
    64 // 4 = 16, blocks 32: (3, 0.1875, {"registers": 3, "shared memory": 3, "warps": 16,
    "blocks": 32}).
    """
    # BEGIN SOLUTION ex00 part 2 (lesson 05 asks for it): write occupancy, then run `flashlib check ex00`
    registers_per_warp = -(-registers_per_thread * 32 // sm["register_unit"]) * sm["register_unit"]
    warps_per_part = sm["registers_per_sm"] // sm["sub_partitions"] // registers_per_warp
    block_shared = (-(-(shared_bytes + sm["reserved_shared_per_block"]) // sm["shared_unit"])
                    * sm["shared_unit"])
    limits = {
        "registers": warps_per_part * sm["sub_partitions"] // num_warps,
        "shared memory": sm["shared_per_sm"] // block_shared if block_shared else sm["max_blocks_per_sm"],
        "warps": sm["max_warps_per_sm"] // num_warps,
        "blocks": sm["max_blocks_per_sm"],
    }
    blocks_per_sm = min(limits.values())
    return blocks_per_sm, blocks_per_sm * num_warps / sm["max_warps_per_sm"], limits
    # END SOLUTION
