"""Mutant of ex00: the CUDA runtime's 1 KB of shared memory reserved per block left out (two
114 KB blocks counted as fitting in 228 KB)."""
EXPECTED_HINT = "reserved_shared_per_block"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute_time, memory_time = flops / peak_flops, bytes_moved / bandwidth
    return max(compute_time, memory_time), "compute" if compute_time >= memory_time else "memory"


def occupancy(num_warps, registers_per_thread, shared_bytes, sm):
    registers_per_warp = -(-registers_per_thread * 32 // sm["register_unit"]) * sm["register_unit"]
    warps_per_part = sm["registers_per_sm"] // sm["sub_partitions"] // registers_per_warp
    block_shared = -(-shared_bytes // sm["shared_unit"]) * sm["shared_unit"]    # no reserve
    limits = {"registers": warps_per_part * sm["sub_partitions"] // num_warps,
              "shared memory": sm["shared_per_sm"] // block_shared if block_shared else sm["max_blocks_per_sm"],
              "warps": sm["max_warps_per_sm"] // num_warps, "blocks": sm["max_blocks_per_sm"]}
    blocks = min(limits.values())
    return blocks, blocks * num_warps / sm["max_warps_per_sm"], limits
