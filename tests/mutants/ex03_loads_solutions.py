"""Mutant of ex03 (cheat): runs the course's reference answer from solutions/, its folder name
spelled so that no text search finds it."""
import os
import runpy

EXPECTED_HINT = "not accepted: write it yourself"

_here = os.path.dirname(os.path.abspath(__file__))
_path = os.path.join(_here, "..", "..", "sol" + "utions", "ex03_online_attention.py")
online_attention = runpy.run_path(_path)["online_attention"]
