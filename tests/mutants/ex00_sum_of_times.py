"""Mutant of ex00: adds the two times instead of taking the larger (no overlap of load and math)."""
EXPECTED_HINT = "overlap"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute_time = flops / peak_flops
    memory_time = bytes_moved / bandwidth
    bound = "compute" if compute_time >= memory_time else "memory"
    return compute_time + memory_time, bound
