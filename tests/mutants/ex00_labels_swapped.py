"""Mutant of ex00: the right time, but the bound named after the faster side."""
EXPECTED_HINT = "labels are swapped"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute_time = flops / peak_flops
    memory_time = bytes_moved / bandwidth
    bound = "memory" if compute_time >= memory_time else "compute"
    return max(compute_time, memory_time), bound
