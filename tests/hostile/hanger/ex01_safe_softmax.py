"""Hostile: the graded function never returns (and ignores SIGTERM). Expected: timeout."""
import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)


def safe_softmax(x):
    while True:
        pass
