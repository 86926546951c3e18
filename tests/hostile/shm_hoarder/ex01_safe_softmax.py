"""Hostile (issue 55): SysV shared memory past --memory, through ctypes reached by a name built at
run time (no static check sees it): shmget, shmat, touch, shmdt: a detached segment no process
maps, which the grader's memory watch does not see. Kept small (64 MB, removed again) so that it
is harmless where grading runs unconfined. Expected (confined): "error: RuntimeError: shmget
refused (errno 1)", 0 points."""
import pkgutil

import numpy as np

ctypes = pkgutil.resolve_name("c" + "types")


def safe_softmax(x):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    shm = libc.shmget(0, 64 << 20, 0o1600)                # IPC_PRIVATE, IPC_CREAT | 0600
    if shm < 0:
        raise RuntimeError(f"shmget refused (errno {ctypes.get_errno()})")
    address = libc.shmat(shm, None, 0)
    ctypes.memset(address, 1, 64 << 20)
    libc.shmdt(ctypes.c_void_p(address))
    libc.shmctl(shm, 0, None)                             # IPC_RMID: gone again
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
