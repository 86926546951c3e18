"""Mutant of ex01: (cheat) reaches flashlib's own safe softmax at run time through
pkgutil.resolve_name and a name built from strings, which no static check sees."""
import numpy as np

EXPECTED_HINT = "not accepted: write it yourself"


def safe_softmax(x):
    """Softmax over the last axis of ``x``, stable for any finite input.

    x: NumPy array (..., N) of float32 or float64, N >= 1; any number of leading axes.
    Returns an array of the same shape and dtype whose rows (last axis) sum to 1.
    Does not modify ``x``.
    """
    import pkgutil
    lib = pkgutil.resolve_name("flash" + "lib.teach.softmax:safe_softmax")
    return lib(x)
