"""Hostile: replies with a 4-byte tensor expanded to 10,000 x 10,000 (400 MB once the grader
computes with it). Expected: crashed (a reply the grader cannot read), 0 points."""
import torch


def safe_softmax(x):
    return torch.zeros(1).expand(10_000, 10_000)
