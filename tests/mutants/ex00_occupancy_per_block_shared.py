"""Mutant of ex00: the blocks that fit in shared memory counted against the per-block maximum
(227 KB on an H100) instead of what the SM holds (228 KB)."""
EXPECTED_HINT = "not the SM's shared memory"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute_time, memory_time = flops / peak_flops, bytes_moved / bandwidth
    return max(compute_time, memory_time), "compute" if compute_time >= memory_time else "memory"


def occupancy(num_warps, registers_per_thread, shared_bytes, sm):
    registers_per_warp = -(-registers_per_thread * 32 // sm["register_unit"]) * sm["register_unit"]
    warps_per_part = sm["registers_per_sm"] // sm["sub_partitions"] // registers_per_warp
    block_shared = (-(-(shared_bytes + sm["reserved_shared_per_block"]) // sm["shared_unit"])
                    * sm["shared_unit"])
    limits = {"registers": warps_per_part * sm["sub_partitions"] // num_warps,
              "shared memory": sm["shared_per_block"] // block_shared if block_shared else sm["max_blocks_per_sm"],
              "warps": sm["max_warps_per_sm"] // num_warps, "blocks": sm["max_blocks_per_sm"]}
    blocks = min(limits.values())
    return blocks, blocks * num_warps / sm["max_warps_per_sm"], limits
