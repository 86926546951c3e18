"""Mutant of ex00: arithmetic intensity computed as bytes per flop, then compared with the ridge."""
EXPECTED_HINT = "flops per byte"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    intensity = bytes_moved / flops          # wrong way up
    ridge = peak_flops / bandwidth
    if intensity >= ridge:
        return flops / peak_flops, "compute"
    return bytes_moved / bandwidth, "memory"
