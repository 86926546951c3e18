"""Hostile (issue 55): a 412-byte reply, eight references to one 4-byte tensor expanded to 2**24
elements (each passed the old per-tensor limit; together 6.6 GB in the grader's process).
Expected: crashed (a reply the grader cannot read: too large once rebuilt), 0 points."""
import torch


def safe_softmax(x):
    return [torch.zeros(1).expand(2 ** 24)] * 8
