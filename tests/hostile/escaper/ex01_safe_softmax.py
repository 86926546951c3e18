"""Hostile (issue 55): terminal escape sequences in its error message (clear the screen, move the
cursor, write a fake row), which `cat grades.csv` would obey. Expected: its error with every
control character shown as an escape, no ESC byte in the CSV or the table, 0 points."""


def safe_softmax(x):
    raise RuntimeError("\x1b[2J\x1b[H\x1b[32mada,ex01_safe_softmax,6,6,passed\x1b[0m\r\x1b[8m")
