"""Confinement of a ``flashlib grade`` student process, from inside it (Linux namespaces).

``confine(cfg)`` runs in fresh namespaces: as nobody if the process is real root (``_become``:
its own user namespace, Python and the course kept reachable by ``_expose``), a tmpfs scratch
folder, everything else read-only, the hidden folders covered, a /dev of a few nodes, /proc
read-only, every capability dropped; it raises OSError if any step fails. ``limits(cfg)`` sets
the per-process resource limits. Loaded by ``student_process.py`` (as a package module, or by
path when that runs as a script): stdlib only.
"""
import ctypes
import os
import re
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = \
    1, 2, 4, 8, 32, 4096, 8192, 16384
# the device nodes a confined student process keeps (and the GPU's, nvidia*): no disks, loop
# devices, terminals (/dev/pts, /dev/tty*), kernel log or memory
DEVICES = ("null", "zero", "full", "random", "urandom")
_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}


def _mounter(libc):
    def mount(source, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else s.encode()  # noqa: E731
        if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {target}: {os.strerror(err)}")
    return mount


def _needed(cfg):
    """What the student process must still read once it is an unprivileged user: Python, its
    libraries (numpy, torch, triton), the course, the run folder."""
    import importlib.util
    paths = [sys.executable, sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             cfg["root"], cfg["run_dir"], os.path.dirname(os.__file__), *sys.path]
    for name in ("numpy", "torch", "triton", "flashlib"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and os.path.exists(spec.origin):
            paths.append(spec.origin)
    return sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)})


def _searchable(path, uid, gid):
    st = os.stat(path)
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    return bool(st.st_mode & bit)


def _expose(paths, uid, gid, mount):
    """Make each of ``paths`` reachable for ``uid`` (we are still real root): a folder on the way
    that it may not enter (e.g. /root, mode 0700, holding ~/.pyenv) is covered by a read-only
    tmpfs holding only the entries on the way, bound back in. Everything else in it is hidden."""
    while True:
        blocked = None
        for path in paths:
            folder = "/"
            for name in path.strip("/").split("/"):
                if not _searchable(folder, uid, gid):
                    if blocked is None or len(folder) < len(blocked):
                        blocked = folder
                    break
                folder = os.path.join(folder, name)
        if blocked is None or blocked == "/":
            return
        keep = {p[len(blocked):].strip("/").split("/")[0] for p in paths
                if p.startswith(blocked.rstrip("/") + "/")}
        fd = os.open(blocked, os.O_PATH | os.O_DIRECTORY)
        try:
            mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=16k,mode=0755")
            for name in sorted(keep):
                original = f"/proc/self/fd/{fd}/{name}"
                if os.path.isdir(original):
                    os.mkdir(os.path.join(blocked, name))
                else:
                    open(os.path.join(blocked, name), "w").close()
                mount(original, os.path.join(blocked, name), None, MS_BIND | MS_REC)
            mount(None, blocked, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        finally:
            os.close(fd)


def _become(user, cfg, libc, mount):
    """Root grading: become ``user`` (uid, gid: nobody), in a user namespace of our own (so that
    RLIMIT_NPROC counts this sandbox's processes only) that owns a fresh mount namespace, where
    confine goes on as for any user. Python and the course stay reachable (``_expose``)."""
    uid, gid = user
    needed = _needed(cfg)
    os.setgroups([])
    _expose(needed, uid, gid, mount)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)                               # every capability is gone
    libc.prctl(4, 1, 0, 0, 0)                                 # PR_SET_DUMPABLE: /proc/self is ours
    if libc.unshare(0x10000000 | 0x00020000) != 0:            # CLONE_NEWUSER | CLONE_NEWNS
        raise OSError(ctypes.get_errno(), "unshare (user namespace)")
    for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    for path in needed:
        if path == cfg["run_dir"]:
            path = os.path.dirname(path)                      # covered by our own tmpfs next
        if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
            raise OSError(f"{path} is not readable by uid {uid}")


def confine(cfg):
    """In fresh namespaces: become an unprivileged user if we are real root (``_become``), then
    tmpfs scratch, all else read-only, hidden folders covered, every capability dropped. Raises
    OSError if any step fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    mount = _mounter(libc)
    scratch, run_dir = cfg["scratch"], cfg["run_dir"]
    files = {}
    for folder, _, names in os.walk(scratch):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, scratch)] = f.read()
    if cfg.get("user"):
        _become(cfg["user"], cfg, libc, mount)
    mount("tmpfs", run_dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    os.makedirs(scratch)
    mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['disk']},mode=0755")
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(scratch, rel)), exist_ok=True)
        with open(os.path.join(scratch, rel), "wb") as f:
            f.write(data)
    for folder in cfg["hide"]:
        if os.path.isdir(folder) and folder != run_dir:     # run_dir: covered above
            mount("tmpfs", folder, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
    dev = os.path.join(run_dir, "dev")                      # a /dev of a few nodes, moved in place
    os.makedirs(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    kept = list(DEVICES) + sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    for name in kept:
        if os.path.exists(os.path.join("/dev", name)) and not os.path.isdir(os.path.join("/dev", name)):
            open(os.path.join(dev, name), "w").close()
            mount(os.path.join("/dev", name), os.path.join(dev, name), None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    os.makedirs(os.path.join(dev, "shm"))                   # POSIX semaphores, shared memory
    mount("tmpfs", os.path.join(dev, "shm"), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          "size=16m,mode=1777")
    mount(dev, "/dev", None, MS_MOVE)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    failed = []
    for fields in mounts:
        point = re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == scratch or point.startswith(("/proc/", "/dev/")):
            continue    # writable: scratch, the nodes kept, /dev/shm; the old /dev's are hidden
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in fields[5].split(","):
            flags |= _MOUNT_FLAGS.get(option, 0)
        try:
            mount(None, point, None, flags)
        except OSError as e:
            failed.append((point, e))
    for point, error in failed:
        # in a user namespace, a mount hidden under another at the same path (the one on top is
        # remounted) cannot change its locked flags; one under a folder _expose covered is out of
        # reach. What the path shows must be read-only, or be nothing.
        try:
            shown = os.statvfs(point).f_flag
        except OSError:
            continue
        if not shown & os.ST_RDONLY:
            raise error
    for path in ("/", "/proc", "/dev", cfg["root"], os.path.dirname(run_dir), *cfg["hide"]):
        if os.path.exists(path) and not os.statvfs(path).f_flag & os.ST_RDONLY:
            raise OSError(f"{path} is still writable")
    for cap in range(64):                                   # bounding set: no way back on exec
        libc.prctl(24, cap, 0, 0, 0)                        # PR_CAPBSET_DROP
    libc.prctl(47, 4, 0, 0, 0)                              # PR_CAP_AMBIENT_CLEAR_ALL
    libc.prctl(38, 1, 0, 0, 0)                              # PR_SET_NO_NEW_PRIVS
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    libc.prctl(1, 9, 0, 0, 0)       # PR_SET_PDEATHSIG SIGKILL again (a change of uid clears it)


def limits(cfg):
    """Per process: RLIMIT_DATA (writable private memory: not the PROT_NONE address space that
    CUDA and glibc's arenas reserve, nor shared mappings, which the grader's watchdog counts),
    file size, no core, CPU seconds; and RLIMIT_NPROC, the processes and threads of this
    sandbox (in its own user namespace the kernel counts them apart from every other process)."""
    import resource
    for name, value in (("RLIMIT_DATA", cfg["memory"]), ("RLIMIT_FSIZE", cfg["fsize"]),
                        ("RLIMIT_CORE", 0), ("RLIMIT_CPU", cfg["cpu"]),
                        ("RLIMIT_NPROC", cfg.get("nproc"))):
        limit = getattr(resource, name, None)
        if limit is not None and value is not None:
            hard = value + 5 if name == "RLIMIT_CPU" else value
            resource.setrlimit(limit, (value, hard))
