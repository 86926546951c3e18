"""Hostile, for a root instructor: read a file only root may read (@SECRET@, set by the test),
talk to a socket only root may use (@SOCKET@, as a container engine's), take uid 0 back.
Reports what it got as its error (the file's text would land in the CSV).
Expected: "error: RuntimeError: got nothing; blocked: ...", 0 points."""
import os
import socket


def _try(name, attempt, got, blocked):
    try:
        attempt()
        got.append(name)
    except OSError as e:
        blocked.append(f"{name} {e.strerror}")


def safe_softmax(x):
    got, blocked = [], []

    def read():
        with open("@SECRET@") as f:
            got.append(f.read())
    _try("secret", read, got, blocked)

    def connect():
        with socket.socket(socket.AF_UNIX) as s:
            s.connect("@SOCKET@")
    _try("socket", connect, got, blocked)
    _try("setuid", lambda: os.setuid(0), got, blocked)
    raise RuntimeError(f"uid {os.getuid()}; got {' '.join(got) or 'nothing'}; "
                       f"blocked: {', '.join(blocked)}")
