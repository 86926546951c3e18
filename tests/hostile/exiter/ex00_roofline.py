"""Hostile: sys.exit(0) on import. Expected: crashed (exit code 0), 0 points."""
import sys

sys.exit(0)
