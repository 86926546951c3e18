"""Hostile: raises KeyboardInterrupt from inside the graded function. Expected: crashed (killed
by SIGINT) for this exercise only; the next exercise (ex03, a right answer) still passes."""


def online_normalizer(x, block_size):
    raise KeyboardInterrupt
