"""Hostile (issue 55): ex09's answers from flashlib.masks (the window rule, BlockMask's tile
classification, its visit lists), its source file executed afresh under a new name (what
withholding the answers at run time did not stop). Expected: 0 points, "error: RuntimeError:
flashlib.masks... is flashlib's own answer ..." (the answers are not in the files it can see)."""
import pkgutil
import types

import numpy as np
import torch

run = pkgutil.resolve_name("builtins:" + "ex" + "ec")


def _reexecuted(name):
    """flashlib's module ``name`` executed afresh from its source file, under a new name."""
    module = pkgutil.resolve_name(name)
    space = {"__name__": "borrowed_" + name.rsplit(".", 1)[-1], "__file__": module.__file__,
             "__package__": module.__package__}
    with open(module.__file__) as f:
        run(compile(f.read(), module.__file__, "exec"), space)
    return space


_masks = types.SimpleNamespace(**_reexecuted("flashlib.masks"))


def sliding_window_allowed(n_q, n_k, window):
    return _masks._window_rule(window, True, n_q, n_k, None)(0, n_q).numpy()


def classify_blocks(allowed, block_size):
    rows = torch.from_numpy(np.ascontiguousarray(allowed))
    mask = _masks.BlockMask(lambda q0, q1: rows[q0:q1], *allowed.shape, block_size=block_size)
    return mask.kinds[0, 0].numpy().astype(np.int64)


def visit_lists(kinds):
    def lists(k):
        k = torch.from_numpy(np.ascontiguousarray(k)).to(torch.int8)
        index, _, count, _ = _masks.visit_lists(k, torch.zeros(k.shape, dtype=torch.int32))
        return [index[r, :count[r]].numpy().astype(np.int64) for r in range(k.shape[0])]
    return lists(kinds), lists(np.asarray(kinds).T)
