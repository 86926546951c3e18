"""Hostile: host-level harm, as issue 36 found it possible as root: open /proc/sys/kernel/
core_pattern for writing, make a block device node of the disk the class lives on (to read it
with debugfs), write to a terminal (@PTY@, a pseudo-terminal the test opened: the instructor's),
list the loop devices and terminals in /dev. It writes nothing anywhere it could do harm, so it
is safe where grading runs unconfined. Reports what it got as its error. Expected (confined):
"error: RuntimeError: blocked: ..." with nothing got, 0 points."""
import os
import stat


def _try(name, attempt, got, blocked):
    try:
        attempt()
        got.append(name)
    except OSError as e:
        blocked.append(f"{name} {e.strerror}")


def safe_softmax(x):
    got, blocked = [], []
    _try("core_pattern", lambda: open("/proc/sys/kernel/core_pattern", "a").close(), got, blocked)

    def node():
        os.mknod("disk", stat.S_IFBLK | 0o600, os.stat("/").st_dev)
        os.remove("disk")
    _try("mknod", node, got, blocked)

    def terminal():
        with open("@PTY@", "w") as f:
            f.write("graded: 99 of 99\n")
    _try("pty", terminal, got, blocked)
    devices = [d for d in os.listdir("/dev") if d.startswith(("loop", "pts", "tty", "sd", "nvme"))]
    got += [f"/dev/{d}" for d in devices]
    raise RuntimeError(f"got {' '.join(got) or 'nothing'}; blocked: {', '.join(blocked)}")
