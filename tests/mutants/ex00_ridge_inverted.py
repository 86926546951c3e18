"""Mutant of ex00: the ridge point taken as bandwidth / peak_flops."""
EXPECTED_HINT = "ridge point is peak_flops / bandwidth"


def roofline(flops, bytes_moved, *, peak_flops, bandwidth):
    intensity = flops / bytes_moved
    ridge = bandwidth / peak_flops           # wrong way up
    if intensity >= ridge:
        return flops / peak_flops, "compute"
    return bytes_moved / bandwidth, "memory"
