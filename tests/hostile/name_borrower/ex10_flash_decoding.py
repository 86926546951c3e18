"""Hostile (issue 55): reaches flashlib's own answer to ex10 (lesson 03's two-way lse merge, folded
over the splits) by a name built at run time, which no static check sees. Expected: 0 points,
"error: RuntimeError: flashlib.teach.tiled.merge_states is flashlib's own answer ..." (the
answer is not in the copy of flashlib it sees)."""
import pkgutil

import numpy as np

_merge = pkgutil.resolve_name("flashlib.teach." + "tiled:merge_states")


def combine_splits(out_parts, lse_parts):
    out = np.zeros_like(out_parts[..., 0, :])                 # nothing merged yet: out 0, lse -inf
    lse = np.full_like(lse_parts[..., 0], -np.inf)
    for s in range(lse_parts.shape[-1]):
        out, lse = _merge(out, lse, out_parts[..., s, :], lse_parts[..., s])
    return out.astype(out_parts.dtype), lse.astype(lse_parts.dtype)
