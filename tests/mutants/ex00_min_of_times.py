"""Mutant of ex00: takes the smaller of the two times."""
EXPECTED_HINT = "smaller of the two times"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute_time = flops / peak_flops
    memory_time = bytes_moved / bandwidth
    bound = "compute" if compute_time >= memory_time else "memory"
    return min(compute_time, memory_time), bound
