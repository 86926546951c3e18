"""Mutant of ex04 (cheat): hands in flashlib's own tile update under the exercise's name."""
import flashlib.teach.tiled as lib

EXPECTED_HINT = "not accepted: write it yourself"

fa2_tile_update = lib.fa2_tile_update
