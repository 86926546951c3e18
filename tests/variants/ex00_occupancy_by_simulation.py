"""Variant of ex00 (correct): roofline through the intensity and the ridge point; occupancy by
placing blocks on an empty SM one at a time, each warp into the register sub-partition with the
most registers free, until a resource runs out (each limit alone, then all together)."""
import math


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    intensity, ridge = flops / bytes_moved, peak_flops / bandwidth
    if intensity >= ridge:
        return flops / peak_flops, "compute"
    return flops / (intensity * bandwidth), "memory"


def _fits(sm, blocks, num_warps, registers_per_thread, shared_bytes, resource):
    """Whether ``blocks`` blocks fit on one SM by ``resource`` alone."""
    if resource == "registers":
        per_warp = math.ceil(registers_per_thread * 32 / sm["register_unit"]) * sm["register_unit"]
        free = [sm["registers_per_sm"] // sm["sub_partitions"]] * sm["sub_partitions"]
        for _ in range(blocks * num_warps):
            part = max(range(len(free)), key=lambda i: free[i])
            if free[part] < per_warp:
                return False
            free[part] -= per_warp
        return True
    if resource == "shared memory":
        need = math.ceil((shared_bytes + sm["reserved_shared_per_block"]) / sm["shared_unit"]) * sm["shared_unit"]
        return blocks * need <= sm["shared_per_sm"]
    if resource == "warps":
        return blocks * num_warps <= sm["max_warps_per_sm"]
    return blocks <= sm["max_blocks_per_sm"]


def occupancy(num_warps, registers_per_thread, shared_bytes, sm):
    limits = {}
    for resource in ("registers", "shared memory", "warps", "blocks"):
        if resource == "shared memory" and shared_bytes + sm["reserved_shared_per_block"] == 0:
            limits[resource] = sm["max_blocks_per_sm"]      # never runs out: not a limit
            continue
        blocks = 0
        while _fits(sm, blocks + 1, num_warps, registers_per_thread, shared_bytes, resource):
            blocks += 1
        limits[resource] = blocks
    blocks = min(limits.values())
    return blocks, blocks * num_warps / sm["max_warps_per_sm"], limits
