"""Hostile (issue 55): reaches flashlib's own answers to ex09 (masks' window rule, BlockMask's tile
classification, its visit lists) by names built at run time, which no static check sees.
Expected: 0 points, "error: RuntimeError: flashlib.masks... is flashlib's own answer ..." (the
answers are not in the copy of flashlib it sees)."""
import pkgutil

import numpy as np
import torch

_masks = pkgutil.resolve_name("flashlib." + "masks")


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
