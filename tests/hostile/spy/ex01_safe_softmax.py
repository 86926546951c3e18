"""Hostile (issue 55): an ordinary instructor's account. Reads a file only the instructor may read
(@SECRET@, mode 0600, as a key under ~/.ssh) and lists the folder it is in, talks to a Unix socket
only the instructor may use (@SOCKET@, as an ssh-agent's or docker's), takes uid 0 back.
Reports what it got as its error (the file's text would land in the CSV). The test fills the
paths. Expected (confined): "error: RuntimeError: uid 65534; got nothing; blocked: ...", 0."""
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
    _try("home", lambda: got.extend(os.listdir(os.path.dirname("@SECRET@"))), got, blocked)

    def connect():
        with socket.socket(socket.AF_UNIX) as s:
            s.connect("@SOCKET@")
            s.sendall(b"sign this")
    _try("socket", connect, got, blocked)
    _try("setuid", lambda: os.setuid(0), got, blocked)
    raise RuntimeError(f"uid {os.getuid()}; got {' '.join(got) or 'nothing'}; "
                       f"blocked: {', '.join(blocked)}")
