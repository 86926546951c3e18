"""Hostile (issue 55): ex10 by lesson 03's two-way lse merge folded over the splits, taken from
flashlib's source file executed afresh under a new name (what withholding the answer at run time
did not stop). Expected: 0 points, "error: RuntimeError: flashlib.teach.tiled.merge_states is
flashlib's own answer ..." (the answer is not in the files it can see)."""
import pkgutil

import numpy as np

run = pkgutil.resolve_name("builtins:" + "ex" + "ec")


def _reexecuted(name):
    """flashlib's module ``name`` executed afresh from its source file, under a new name."""
    module = pkgutil.resolve_name(name)
    space = {"__name__": "borrowed_" + name.rsplit(".", 1)[-1], "__file__": module.__file__,
             "__package__": module.__package__}
    with open(module.__file__) as f:
        run(compile(f.read(), module.__file__, "exec"), space)
    return space


_merge = _reexecuted("flashlib.teach.tiled")["merge_states"]


def combine_splits(out_parts, lse_parts):
    out = np.zeros_like(out_parts[..., 0, :])                 # nothing merged yet: out 0, lse -inf
    lse = np.full_like(lse_parts[..., 0], -np.inf)
    for s in range(lse_parts.shape[-1]):
        out, lse = _merge(out, lse, out_parts[..., s, :], lse_parts[..., s])
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
