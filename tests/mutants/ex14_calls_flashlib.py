"""Mutant of ex14 (cheat): hands in flashlib.distributed's own merge and shard, imported."""
from flashlib.distributed import merge  # noqa: F401
from flashlib.teach.ring import ring_step  # noqa: F401

EXPECTED_HINT = "not accepted: write it yourself"


def zigzag_shard(x, rank, world):
    """The positions rank ``rank`` of ``world`` holds in the zigzag layout."""
    from flashlib.distributed import shard
    return shard(x, rank, world, layout="zigzag")
