"""Variant of ex00 (correct): the roofline through the attainable rate min(peak, intensity x
bandwidth); occupancy with math.ceil and math.floor on true divisions, limits worked out per warp
and then per block."""
import math


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    attainable = min(peak_flops, flops / bytes_moved * bandwidth)
    return flops / attainable, "compute" if attainable == peak_flops else "memory"


def occupancy(num_warps, registers_per_thread, shared_bytes, sm):
    registers_per_warp = math.ceil(registers_per_thread * 32 / sm["register_unit"]) * sm["register_unit"]
    part = sm["registers_per_sm"] / sm["sub_partitions"]
    warps_by_registers = sm["sub_partitions"] * math.floor(part / registers_per_warp)
    block_shared = math.ceil((shared_bytes + sm["reserved_shared_per_block"]) / sm["shared_unit"]) * sm["shared_unit"]
    limits = {
        "registers": math.floor(warps_by_registers / num_warps),
        "shared memory": math.floor(sm["shared_per_sm"] / block_shared) if block_shared > 0 else sm["max_blocks_per_sm"],
        "warps": math.floor(sm["max_warps_per_sm"] / num_warps),
        "blocks": sm["max_blocks_per_sm"],
    }
    blocks_per_sm = min(limits.values())
    occupancy = blocks_per_sm * num_warps / sm["max_warps_per_sm"]
    return blocks_per_sm, occupancy, limits
