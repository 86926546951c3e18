"""Mutant of ex07 (cheat): hands in flashlib's own kernel step."""
from flashlib.kernels.tile import tile_update  # noqa: F401

EXPECTED_HINT = "not accepted: write it yourself"
