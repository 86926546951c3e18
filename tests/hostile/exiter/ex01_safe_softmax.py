"""Hostile: os._exit(7) from inside the graded function. Expected: crashed (exit code 7)."""
import os


def safe_softmax(x):
    os._exit(7)
