"""Has ex00 (a right answer) and nothing else. Expected: ex00 passed, ex01-ex04 missing."""


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    compute, memory = flops / peak_flops, bytes_moved / bandwidth
    return max(compute, memory), "compute" if compute > memory else "memory"
