"""Mutant of ex00: floor and ceil swapped: registers per warp rounded down to the unit, and the
blocks that fit rounded up."""
EXPECTED_HINT = "the other way round"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute_time, memory_time = flops / peak_flops, bytes_moved / bandwidth
    return max(compute_time, memory_time), "compute" if compute_time >= memory_time else "memory"


def occupancy(num_warps, registers_per_thread, shared_bytes, sm):
    unit = sm["register_unit"]
    registers_per_warp = registers_per_thread * 32 // unit * unit          # floor, not ceil
    warps_per_part = -(-(sm["registers_per_sm"] // sm["sub_partitions"]) // registers_per_warp)   # ceil
    block_shared = (shared_bytes + sm["reserved_shared_per_block"]) // sm["shared_unit"] * sm["shared_unit"]
    limits = {"registers": -(-warps_per_part * sm["sub_partitions"] // num_warps),
              "shared memory": -(-sm["shared_per_sm"] // block_shared) if block_shared else sm["max_blocks_per_sm"],
              "warps": -(-sm["max_warps_per_sm"] // num_warps), "blocks": sm["max_blocks_per_sm"]}
    blocks = min(limits.values())
    return blocks, blocks * num_warps / sm["max_warps_per_sm"], limits
