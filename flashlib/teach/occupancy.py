"""Occupancy: how many programs (thread blocks) of a compiled kernel one SM holds, and why.

The rules of NVIDIA's CUDA occupancy calculator (``cuda_occupancy.h``), stated at ``occupancy``:
registers allocated per warp in units, split over the SM's sub-partitions; shared memory per
block with the runtime's reserve, in allocation units; warp slots; block slots. ``SM_LIMITS``
holds the per-SM figures of the GPUs in ``kernels.config.TARGETS`` (T4, A100, L4, H100/H200).
Exercise 00's part 2 is the learner's ``occupancy``; lessons 05 and 07 apply it to compiled
kernels through ``flashlib.teach.profile``, which re-exports these names.
"""
from typing import NamedTuple

from ..kernels.config import TARGETS

__all__ = ["SMLimits", "SM_LIMITS", "BY_CAPABILITY", "sm_limits", "Occupancy", "occupancy"]


class SMLimits(NamedTuple):
    """One SM's limits, as the CUDA occupancy calculator uses them (field names are those of
    exercise 00's ``sm`` dict: ``sm._asdict()`` is one)."""
    name: str
    registers_per_sm: int            # 32-bit registers in one SM's register file
    register_unit: int               # a warp's registers are allocated in chunks of this many
    sub_partitions: int              # the register file is split evenly among these
    max_warps_per_sm: int            # warp slots: resident warps at most
    max_blocks_per_sm: int           # resident thread blocks (Triton programs) at most
    shared_per_sm: int               # bytes of shared memory one SM can give its blocks
    shared_per_block: int            # bytes one block may use (shared_per_sm - the reserve)
    reserved_shared_per_block: int   # bytes the CUDA runtime keeps per block (0 before sm80)
    shared_unit: int                 # shared memory is allocated in chunks of this many bytes


# What kernels.config.TARGETS does not hold, per GPU: (name, warp slots, block slots, shared
# memory the runtime reserves per block, shared-memory allocation unit). NVIDIA's figures (CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability"; the allocation units and
# the 4 register sub-partitions are the occupancy calculator's, cuda_occupancy.h). Every one of
# these GPUs has 65,536 registers per SM allocated to warps in units of 256.
_PER_SM = {"t4": ("T4 (sm75)", 32, 16, 0, 256), "a100": ("A100 (sm80)", 64, 32, 1024, 128),
           "l4": ("L4 (sm89)", 48, 24, 1024, 128), "h100": ("H100/H200 (sm90)", 64, 32, 1024, 128)}
# the per-block shared memory is config.TARGETS' (what the kernels' configs are sized to); an SM
# holds that plus one reserve (228 KB = 227 KB + 1 KB on an H100)
SM_LIMITS = {gpu: SMLimits(name, 65536, 256, 4, warps, blocks, TARGETS[gpu].smem + reserve, TARGETS[gpu].smem,
                           reserve, unit)
             for gpu, (name, warps, blocks, reserve, unit) in _PER_SM.items()}
BY_CAPABILITY = {**{TARGETS[gpu].capability: gpu for gpu in SM_LIMITS}, (8, 6): "l4"}   # sm86 as sm89


def sm_limits(sm="h100") -> SMLimits:
    """``sm`` as an SMLimits: a key of SM_LIMITS ("h100"), a compute capability ((9, 0)), an
    SMLimits, or a mapping with its fields (exercise 00's dicts)."""
    if isinstance(sm, SMLimits):
        return sm
    if isinstance(sm, tuple) and sm in BY_CAPABILITY:
        return SM_LIMITS[BY_CAPABILITY[sm]]
    if isinstance(sm, str) and sm.lower() in SM_LIMITS:
        return SM_LIMITS[sm.lower()]
    if isinstance(sm, str) and sm.lower() == "h200":
        return SM_LIMITS["h100"]
    if hasattr(sm, "keys"):
        return SMLimits(**{"name": "custom", **{k: sm[k] for k in sm.keys() if k in SMLimits._fields}})
    raise ValueError(f"no SM limits for {sm!r}: give one of {sorted(SM_LIMITS)}, a compute "
                     "capability such as (9, 0), or an SMLimits")


class Occupancy(NamedTuple):
    """What ``occupancy`` returns (a tuple in this order, as exercise 00's function returns)."""
    blocks_per_sm: int       # programs resident on one SM at once (0: the kernel cannot launch)
    occupancy: float         # resident warps / the SM's warp slots
    limits: dict             # blocks per SM each limit alone allows

    @property
    def limited_by(self) -> list:
        """The limits that bind (every one equal to blocks_per_sm)."""
        return [name for name, n in self.limits.items() if n == self.blocks_per_sm]


def _round_up(x, unit):
    return -(-x // unit) * unit


def occupancy(num_warps, registers_per_thread, shared_bytes, sm="h100") -> Occupancy:
    """Programs (thread blocks) of a kernel resident on one SM, by the occupancy calculator's rules.

    num_warps: warps per program; registers_per_thread: what the compiler allocated (``n_regs``);
    shared_bytes: the program's shared memory (Triton's ``metadata.shared``); sm: see ``sm_limits``.
    The rules (NVIDIA's CUDA occupancy calculator, ``cuda_occupancy.h``), each a number of blocks:

    - registers: a warp's registers, registers_per_thread x 32, are allocated rounded up to a
      multiple of register_unit (256); the register file is split evenly among sub_partitions (4)
      and a warp takes its registers from one part, so an SM holds sub_partitions x
      floor((registers_per_sm / sub_partitions) / registers per warp) warps, and floor(that /
      num_warps) blocks;
    - shared memory: a block takes shared_bytes plus the runtime's reserved_shared_per_block
      (1 KB from sm80 on), rounded up to a multiple of shared_unit (128 B); blocks =
      floor(shared_per_sm / that). (228 KB per SM less the 1 KB reserve is the 227 KB a block may
      use, so a block over that limit gets 0.) A block needing none is not limited by it;
    - warps: floor(max_warps_per_sm / num_warps) (64 warp slots on an H100);
    - blocks: max_blocks_per_sm (32 on an H100).

    Returns Occupancy(blocks_per_sm = the smallest limit, occupancy = blocks_per_sm x num_warps /
    max_warps_per_sm, limits = {"registers", "shared memory", "warps", "blocks"}: blocks each
    allows). Assumes the largest shared-memory carve-out; registers_per_thread None (unknown)
    leaves the register limit out.
    """
    sm = sm_limits(sm)
    if num_warps < 1 or shared_bytes < 0 or (registers_per_thread is not None and registers_per_thread < 0):
        raise ValueError(f"num_warps={num_warps}, registers_per_thread={registers_per_thread}, "
                         f"shared_bytes={shared_bytes}: expected num_warps >= 1 and sizes >= 0")
    limits = {}
    if registers_per_thread is not None:
        per_warp = _round_up(registers_per_thread * 32, sm.register_unit)
        if per_warp:
            warps = sm.sub_partitions * ((sm.registers_per_sm // sm.sub_partitions) // per_warp)
            limits["registers"] = warps // num_warps
        else:
            limits["registers"] = sm.max_blocks_per_sm
    per_block = _round_up(shared_bytes + sm.reserved_shared_per_block, sm.shared_unit)
    limits["shared memory"] = sm.shared_per_sm // per_block if per_block else sm.max_blocks_per_sm
    limits["warps"] = sm.max_warps_per_sm // num_warps
    limits["blocks"] = sm.max_blocks_per_sm
    blocks = min(limits.values())
    return Occupancy(blocks, blocks * num_warps / sm.max_warps_per_sm, limits)
