"""Mutant of ex01 (cheat): hands in flashlib's own safe softmax."""
from flashlib.teach.softmax import safe_softmax  # noqa: F401

EXPECTED_HINT = "not accepted: write it yourself"
