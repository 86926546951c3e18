"""Mutant of ex00: the whole register file divided by a warp's registers, as if a warp could take
its registers from several of the 4 sub-partitions (80-register warps: 25 instead of 24)."""
EXPECTED_HINT = "sub_partitions"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute_time, memory_time = flops / peak_flops, bytes_moved / bandwidth
    return max(compute_time, memory_time), "compute" if compute_time >= memory_time else "memory"


def occupancy(num_warps, registers_per_thread, shared_bytes, sm):
    registers_per_warp = -(-registers_per_thread * 32 // sm["register_unit"]) * sm["register_unit"]
    warps = sm["registers_per_sm"] // registers_per_warp                      # one pool
    block_shared = (-(-(shared_bytes + sm["reserved_shared_per_block"]) // sm["shared_unit"])
                    * sm["shared_unit"])
    limits = {"registers": warps // num_warps,
              "shared memory": sm["shared_per_sm"] // block_shared if block_shared else sm["max_blocks_per_sm"],
              "warps": sm["max_warps_per_sm"] // num_warps, "blocks": sm["max_blocks_per_sm"]}
    blocks = min(limits.values())
    return blocks, blocks * num_warps / sm["max_warps_per_sm"], limits
