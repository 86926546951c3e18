"""Has ex00 (a right answer) and nothing else. Expected: ex00 passed, ex01-ex04 missing."""


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute, memory = flops / peak_flops, bytes_moved / bandwidth
    return max(compute, memory), "compute" if compute > memory else "memory"


def occupancy(num_warps, registers_per_thread, shared_bytes, sm):
    per_warp = -(-registers_per_thread * 32 // sm["register_unit"]) * sm["register_unit"]
    block = -(-(shared_bytes + sm["reserved_shared_per_block"]) // sm["shared_unit"]) * sm["shared_unit"]
    limits = {"registers": sm["sub_partitions"] * (sm["registers_per_sm"] // sm["sub_partitions"] // per_warp) // num_warps,
              "shared memory": sm["shared_per_sm"] // block if block else sm["max_blocks_per_sm"],
              "warps": sm["max_warps_per_sm"] // num_warps, "blocks": sm["max_blocks_per_sm"]}
    blocks = min(limits.values())
    return blocks, blocks * num_warps / sm["max_warps_per_sm"], limits
