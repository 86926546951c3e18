"""Hostile: imports the reference answer from the course's solutions/ folder, its name spelled so
that no text search finds it. Expected: not accepted: write it yourself (reads solutions)."""
import os
import sys

sys.path.insert(0, os.path.join(os.environ.get("FLASHLIB_ROOT", "."), "sol" + "utions"))
try:
    from ex02_online_softmax import online_normalizer  # noqa: F401
except ImportError:
    def online_normalizer(x, block_size):
        raise NotImplementedError
