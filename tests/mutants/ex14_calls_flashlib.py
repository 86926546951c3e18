"""Mutant of ex14 (cheat): hands in flashlib's own ring step and ring loop, imported."""
from flashlib.teach.ring import ring_loop as ring_attention  # noqa: F401
from flashlib.teach.ring import ring_step  # noqa: F401

EXPECTED_HINT = "not accepted: write it yourself"


def zigzag_shard(x, rank, world):
    """The positions rank ``rank`` of ``world`` holds in the zigzag layout."""
    from flashlib.distributed import shard
    return shard(x, rank, world, layout="zigzag")
