"""Block configs: autotuned on a GPU, one fixed config otherwise.

Autotuning compiles and times every config once per key (problem size bucket, head dim, causal,
...), so it only runs on a GPU with ``runtime.AUTOTUNE``. Through the interpreter (no GPU) a kernel
runs with 64x64 blocks: the interpreter costs per program per loop step, whatever the tile size.
"""
import triton

from .. import runtime

INTERPRETER_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64}
KEY = ["n_bucket", "BLOCK_D", "CAUSAL", "DOT_PRECISION"]


def size_bucket(*lengths) -> int:
    """Autotuning key for sequence lengths: the next power of two (capped), not the exact size."""
    return min(triton.next_power_of_2(max(lengths)), 1 << 16)


def prune_for_head_dim(configs, named_args, **kwargs):
    """Large head dims: big tiles with deep pipelines no longer fit in shared memory."""
    block_d = named_args.get("BLOCK_D", kwargs.get("BLOCK_D", 64))
    keep = [c for c in configs if block_d <= 128 or c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 128 * 64]
    return keep or configs


def tuned(kernel, configs):
    """Return ``(launchable, fixed_kwargs)`` for ``kernel`` given (BLOCK_M, BLOCK_N, warps, stages)."""
    if runtime.INTERPRET:
        return kernel, dict(INTERPRETER_CONFIG)
    if not runtime.AUTOTUNE:
        bm, bn, warps, stages = configs[0]
        return kernel, dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
    triton_configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                      for bm, bn, w, s in configs]
    return triton.autotune(triton_configs, key=KEY,
                           prune_configs_by={"early_config_prune": prune_for_head_dim})(kernel), {}
