"""Run one student's exercise file in a confined process; call its functions from the grader.

``flashlib grade`` (``flashlib.classroom``) grades in two processes per student and exercise:

- the **grader** (trusted) loads the exercise's grader and runs its checks ``check(impl, rng)``
  itself: references, tolerances, comparisons and the verdict never leave it;
- the **student process** (this file, run as a plain script: ``python -I -B sandbox.py --child``)
  imports the student's file and does only what the grader asks over two pipes: call a function
  of the file with given arguments, or launch a Triton kernel with the student's ``@triton.jit``
  function plugged in. It answers with outputs, never with a grade: what it prints, forges or
  patches (numpy, torch, flashlib.testing) cannot reach the verdict.

``impl`` in the grader is a namespace of proxies. A plain function's proxy pickles its arguments
(NumPy arrays and torch tensors as raw bytes with dtype, shape, strides and storage offset), runs
the call in the student process and brings back the result and every argument the call changed
in place (a tensor's whole storage, so a kernel writing into a view of a larger buffer shows, as
the ex05 grader needs). A ``@triton.jit`` function's proxy is a ``KernelInterface`` whose ``.fn``
has the student's signature and source (read from the grader's own copy of the file), so the
graders' ``inspect`` checks work; any kernel launch that receives such a proxy (a grader's
harness kernel, ``fa1_forward``, ``fa2_forward``) is routed to the student process: the grader
resolves the grid and sends the kernel's name, and the launch runs there on copies of the
tensors, which come back afterwards. So on the Triton exercises (ex06, ex07) the *launch* runs in
the student's process, with its copy of flashlib and Triton: a student who patches those could
fake a kernel's output. The student process therefore compares, after import and at the end,
the functions and classes of flashlib, numpy, torch and Triton's runtime with a snapshot taken
before the import, and reports every change; the grader then refuses the file. Replies are
decoded with an unpickler that builds only plain data and arrays (no classes, no code).

Confinement. When ``unshare`` can create Linux namespaces (root, or unprivileged user
namespaces), the student process runs in private mount, PID, network and IPC namespaces: every
mount is remounted read-only, the student's folder is a size-limited tmpfs holding a copy of the
submission (cwd, HOME and TMPDIR point there), solutions/, tests/, .git, lessons/, the class
folder and the other students' scratch folders are covered by empty tmpfs, all capabilities are
dropped (no remount, no way back), it sees no other process and no network. Otherwise (macOS,
containers without the capability) it runs as the grader's user in a scratch copy: nothing stops
it writing where that user can, and an audit hook that refuses reads of solutions/, tests/ and
the class folder can be bypassed (ctypes, subprocesses). In both modes resource limits apply
(memory as RLIMIT_DATA, CPU seconds, file size) and the grader enforces a wall-clock limit,
killing the whole process group (in namespaces: the whole PID namespace, daemons included).
``flashlib.classroom`` also hashes the class folder before and after and restores what changed.
Not prevented in either mode: reading files outside the hidden folders (the course library,
/etc, the grader's home), fork bombs slowing the machine until the time limit, memory that
RLIMIT_DATA does not count (shared mappings, GPU memory), and, outside namespaces, a student
process signalling or killing the grader's processes (same user).
``flashlib grade`` runs kernels through Triton's interpreter, also on GPU machines; compiled
launches (JITFunction, CUDA tensors) took the same route in the same tests once, on an H100 with
Triton 3.6. Autotuning is off (``FLASHLIB_AUTOTUNE=0``) so that the grader resolves every grid.
"""
import builtins
import ctypes
import inspect
import io
import json
import os
import pickle
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types

MAX_REPLY = 32 << 20           # bytes: a larger reply from the student process is refused
_HEADER = 4
_FS_EVENTS = {"open", "os.listdir", "os.scandir", "os.remove", "os.rmdir", "os.mkdir", "os.rename",
              "os.chmod", "os.chown", "os.truncate", "os.utime", "os.link", "os.symlink",
              "shutil.rmtree"}
_WATCHED = ("numpy", "numpy.testing", "numpy.linalg", "torch", "torch.testing",
            "torch.nn.functional", "triton", "triton.runtime.jit", "triton.runtime.interpreter",
            "math")


class SandboxTimeout(BaseException):
    """The time limit passed (a BaseException: the graders' ``except Exception`` let it by)."""


class SandboxGone(BaseException):
    """The student process exited, or broke the protocol."""

    def __init__(self, why, returncode=None):
        super().__init__(why)
        self.returncode = returncode


# ---------------------------------------------------------------------------------------------
# the wire: frames of pickles whose arrays and tensors travel as raw bytes

def _torch():
    return sys.modules.get("torch")


class _Encoder(pickle.Pickler):
    """Pickle with NumPy arrays, NumPy scalars, torch tensors (and proxies) as persistent ids.

    ``known`` maps storages the other side already holds (data_ptr -> index) to their index.
    ``objects`` lists the arrays and tensor storages sent, in index order (for copy-back)."""

    def __init__(self, file, known=None, extra=None):
        super().__init__(file, protocol=4)
        self.buffers, self.objects, self._index = [], [], {}
        self.known, self.extra = known or {}, extra

    def _register(self, key, obj, data):
        if key not in self._index:
            self._index[key] = len(self.objects)
            self.objects.append(obj)
            self.buffers.append(data)
        return self._index[key]

    def persistent_id(self, obj):
        np, torch = sys.modules.get("numpy"), _torch()
        if np is not None and isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                return ("list", obj.tolist())
            i = self._register(("nd", id(obj)), obj, np.ascontiguousarray(obj).tobytes())
            return ("nd", i, obj.dtype.str, obj.shape, bool(obj.flags.writeable))
        if np is not None and isinstance(obj, np.generic) and not obj.dtype.hasobject:
            return ("np", obj.dtype.str, obj.tobytes())
        if torch is not None and isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided or obj.is_conj() or obj.is_neg():
                raise TypeError(f"cannot send a {obj.layout} tensor")
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if key in self.known:
                ref = ("known", self.known[key])
            else:
                ref = ("buf", self._register(("ts", key), storage, _storage_bytes(storage)))
            return ("ts", ref, str(obj.dtype).removeprefix("torch."), obj.device.type,
                    obj.storage_offset(), tuple(obj.shape), tuple(obj.stride()))
        return self.extra(obj) if self.extra is not None else None


def _storage_bytes(storage):
    torch = _torch()
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return flat.cpu().numpy().tobytes()


def _storage_from(data, device):
    torch = _torch()
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)
    return flat.to(device).untyped_storage()


class _Decoder(pickle.Unpickler):
    """The inverse of _Encoder. restricted=True (the grader reading the student process) builds
    nothing but plain data, arrays and tensors: no class or function can be named."""

    SAFE = {("builtins", "complex"), ("builtins", "slice"), ("builtins", "range")}

    def __init__(self, file, buffers, *, restricted, storages=(), extra=None):
        super().__init__(file)
        self.buffers, self.restricted, self.extra = buffers, restricted, extra
        self.storages = list(storages)      # ("known", i) refers to these
        self.arrays, self.new_storages = {}, {}

    def find_class(self, module, name):
        if self.restricted and (module, name) not in self.SAFE:
            raise pickle.UnpicklingError(f"{module}.{name} is not accepted from a submission")
        return super().find_class(module, name)

    def persistent_load(self, pid):
        kind = pid[0]
        if kind == "list":
            return pid[1]
        if kind == "np":
            import numpy as np
            return np.frombuffer(pid[2], dtype=np.dtype(pid[1]))[0]
        if kind == "nd":
            import numpy as np
            _, i, dtype, shape, writeable = pid
            if i not in self.arrays:
                array = np.frombuffer(bytearray(self.buffers[i]), dtype=np.dtype(dtype))
                array = array.reshape(tuple(int(n) for n in shape))
                array.flags.writeable = bool(writeable)
                self.arrays[i] = array
            return self.arrays[i]
        if kind == "ts":
            import torch
            (where, i), dtype, device, offset, size, stride = pid[1:]
            dtype = getattr(torch, str(dtype), None)
            if not isinstance(dtype, torch.dtype) or device not in ("cpu", "cuda"):
                raise pickle.UnpicklingError(f"a tensor of {pid[2]!r} on {device!r}")
            if where == "known":
                storage = self.storages[i]
            else:
                if i not in self.new_storages:
                    self.new_storages[i] = _storage_from(self.buffers[i], device)
                storage = self.new_storages[i]
            return torch.empty(0, dtype=dtype, device=storage.device).set_(
                storage, int(offset), tuple(int(n) for n in size), tuple(int(n) for n in stride))
        if kind == "student" and self.extra is not None:
            return self.extra(pid)
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")


def encode(message, *, known=None, extra=None):
    """(frame bytes, encoder) for a message."""
    body = io.BytesIO()
    encoder = _Encoder(body, known=known, extra=extra)
    encoder.dump(message)
    data = pickle.dumps((body.getvalue(), encoder.buffers), protocol=4)
    return len(data).to_bytes(_HEADER, "big") + data, encoder


def decode(data, *, restricted, storages=(), extra=None):
    """(message, decoder) from a frame's payload."""
    outer = _Decoder(io.BytesIO(data), [], restricted=restricted)
    body, buffers = outer.load()
    if not isinstance(body, bytes) or not isinstance(buffers, list) or \
            not all(isinstance(b, bytes) for b in buffers):
        raise pickle.UnpicklingError("malformed frame")
    decoder = _Decoder(io.BytesIO(body), buffers, restricted=restricted, storages=storages,
                       extra=extra)
    return decoder.load(), decoder


# ---------------------------------------------------------------------------------------------
# the student process

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}


def _confine(cfg):
    """In fresh namespaces (we are root there): tmpfs scratch, all else read-only, hidden
    folders covered, every capability dropped. Raises OSError if any step fails."""
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else s.encode()  # noqa: E731
        if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {target}: {os.strerror(err)}")

    scratch, run_dir = cfg["scratch"], cfg["run_dir"]
    files = {}
    for folder, _, names in os.walk(scratch):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, scratch)] = f.read()
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
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        point = re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == scratch or point == "/proc" or point.startswith("/proc/"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in fields[5].split(","):
            flags |= _MOUNT_FLAGS.get(option, 0)
        mount(None, point, None, flags)
    for path in ("/", cfg["root"], os.path.dirname(run_dir), *cfg["hide"]):
        if os.path.exists(path) and not os.statvfs(path).f_flag & os.ST_RDONLY:
            raise OSError(f"{path} is still writable")
    for cap in range(64):                                   # bounding set: no way back on exec
        libc.prctl(24, cap, 0, 0, 0)                        # PR_CAPBSET_DROP
    libc.prctl(47, 4, 0, 0, 0)                              # PR_CAP_AMBIENT_CLEAR_ALL
    libc.prctl(38, 1, 0, 0, 0)                              # PR_SET_NO_NEW_PRIVS
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _limits(cfg):
    import resource
    # RLIMIT_DATA: writable private memory (not the PROT_NONE address space CUDA reserves)
    for name, value in (("RLIMIT_DATA", cfg["memory"]), ("RLIMIT_FSIZE", cfg["fsize"]),
                        ("RLIMIT_CORE", 0), ("RLIMIT_CPU", cfg["cpu"])):
        limit = getattr(resource, name, None)
        if limit is not None and value is not None:
            hard = value + 5 if name == "RLIMIT_CPU" else value
            resource.setrlimit(limit, (value, hard))


def _origin(obj):
    """The file that defines a function (or a @triton.jit function), or None."""
    while not isinstance(obj, types.FunctionType) and hasattr(obj, "fn"):
        obj = obj.fn
    obj = getattr(obj, "func", obj)                          # functools.partial
    code = getattr(obj, "__code__", None)
    if code is not None:
        return code.co_filename
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return getattr(module, "__file__", None) if isinstance(obj, type) else None


def _is_kernel(obj):
    jit = sys.modules.get("triton.runtime.jit")
    return jit is not None and isinstance(obj, jit.KernelInterface)


def module_from_source(path, text, name):
    """Execute ``text`` as a new module ``name`` with __file__ ``path`` (linecache primed, so
    that inspect and Triton can read its source even where the file is hidden)."""
    import linecache
    linecache.cache[path] = (len(text), None, text.splitlines(True), path)
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(text, path, "exec"), module.__dict__)
    return module


class _Child:
    """The student process's side: load the file, then serve calls and launches."""

    def __init__(self, cfg):
        self.cfg, self.flags, self.module, self.graders = cfg, [], None, {}
        self.path = os.path.join(cfg["scratch"], cfg["file"])
        self.watch = []

    def _snapshot(self):
        pairs = []
        for name, mod in list(sys.modules.items()):
            if mod is None or not (name in _WATCHED or name.split(".")[0] == "flashlib"):
                continue
            for key, value in list(vars(mod).items()):
                if callable(value) or isinstance(value, types.ModuleType):
                    pairs.append((mod, f"{name}.{key}", key, value,
                                  getattr(value, "__code__", None)))
                if isinstance(value, type) and value.__module__ == name:
                    pairs += [(value, f"{name}.{key}.{k}", k, v, None)
                              for k, v in list(vars(value).items()) if callable(v)]
        return pairs

    def _patched(self):
        changed = []
        for owner, label, key, value, code in self.watch:
            now = vars(owner).get(key)
            if now is not value or code is not None and getattr(now, "__code__", None) is not code:
                changed.append(label)
        return changed

    def _guard(self):
        """An audit hook refusing (and reporting) reads of the hidden folders and writes to the
        protected ones: Python-level only (ctypes or a subprocess get past it; confinement,
        where there is some, does not depend on it)."""
        hidden = tuple(os.path.realpath(h) + os.sep for h in self.cfg["hide"])
        protected = hidden + tuple(os.path.realpath(h) + os.sep for h in self.cfg["protect"])
        own = os.path.realpath(self.cfg["scratch"]) + os.sep
        writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

        def hook(event, args):
            if event not in _FS_EVENTS:
                return
            mode, flags = (args[1], args[2]) if event == "open" else \
                ("r" if event in ("os.listdir", "os.scandir") else "w", 0)
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & writing != 0)
            for arg in args[:2 if event in ("os.rename", "os.link", "os.symlink") else 1]:
                if not isinstance(arg, (str, bytes, os.PathLike)):
                    continue
                path = os.path.realpath(os.fsdecode(arg)) + os.sep
                if path.startswith(own) or not path.startswith(protected if write else hidden):
                    continue
                self.flags.append(("write" if write else "read", path[:-1]))
                raise PermissionError(f"{path[:-1]}: out of bounds while graded")
        sys.addaudithook(hook)

    def load(self, msg):
        for name in msg["preload"]:
            __import__(name)
        self.watch = self._snapshot()
        self._guard()
        sys.path.append(self.cfg["scratch"])
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        stem = os.path.splitext(os.path.basename(self.path))[0]
        try:
            self.module = module_from_source(self.path, text, stem)
        except NotImplementedError:
            return {"status": "not done"}
        except Exception as e:
            return {"status": "error", "error": self._error(e)}
        names = {}
        for key, value in vars(self.module).items():
            if key.startswith("__"):
                continue
            if _is_kernel(value):
                fn = value
                while not isinstance(fn, types.FunctionType) and hasattr(fn, "fn"):
                    fn = fn.fn
                params = [(p.name, int(p.kind)) for p in inspect.signature(fn).parameters.values()]
                names[key] = ("jit", params, fn.__code__.co_firstlineno)
            elif callable(value):
                names[key] = ("function",)
            elif isinstance(value, (int, float, str, bool, type(None))):
                names[key] = ("value", value)
        self.flags += [("patch", label) for label in self._patched()]
        return {"status": "ok", "names": names}

    def _student(self, pid):
        obj = getattr(self.module, pid[1])
        if _origin(obj) != self.path:
            self.flags.append(("foreign", pid[1], str(_origin(obj))))
        return obj

    def _error(self, e):
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == self.path]
        builtin = next(c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins")
        return {"type": builtin, "message": str(e)[:2000], "line": lines[-1] if lines else None}

    def _kernel(self, ref):
        if ref[0] == "student":
            return self._student(ref)
        _, path, module_name, attr, text = ref
        if text is not None:
            if path not in self.graders:
                self.graders[path] = module_from_source(path, text, "_flashlib_grader")
            return getattr(self.graders[path], attr)
        if module_name.split(".")[0] != "flashlib":
            raise ValueError(f"refusing to launch {module_name}.{attr}")
        __import__(module_name)
        return getattr(sys.modules[module_name], attr)

    def serve(self, req, rep):
        while True:
            data = _read_frame(req, None)
            if data is None:
                return
            msg, decoder = decode(data, restricted=False, extra=self._student)
            op = msg["op"]
            if op == "load":
                reply = self.load(msg)
            elif op == "finish":
                reply = {"patched": self._patched()}
            else:
                reply = self._run(msg, decoder)
            reply["flags"], self.flags = self.flags, []
            known = {s.data_ptr(): i for i, s in decoder.new_storages.items()}
            try:
                frame, _ = encode(reply, known=known)
            except Exception as e:
                kind = type(reply.pop("result", None)).__name__
                reply["error"] = {"type": "TypeError", "line": None, "message":
                                  f"returned a {kind}, which the grader cannot receive ({e})"}
                frame, _ = encode(reply, known=known)
            _write_all(rep, frame, None)

    def _run(self, msg, decoder):
        before = {i: a.tobytes() for i, a in decoder.arrays.items()}
        stored = {i: _storage_bytes(s) for i, s in decoder.new_storages.items()}
        reply = {}
        try:
            if msg["op"] == "call":
                fn = self._student(("student", msg["name"]))
                reply["result"] = fn(*msg["args"], **msg["kwargs"])
            else:
                kernel = self._kernel(msg["kernel"])
                kernel[msg["grid"]](*msg["args"], **msg["kwargs"])
                reply["result"] = None
        except Exception as e:
            reply = {"error": self._error(e)}
        reply["arrays"] = {i: a.tobytes() for i, a in decoder.arrays.items()
                           if a.tobytes() != before[i]}
        reply["storages"] = {i: b for i, s in decoder.new_storages.items()
                             if (b := _storage_bytes(s)) != stored[i]}
        return reply


def _child_main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    cfg = json.loads(argv[2])
    import importlib.util
    if importlib.util.find_spec("flashlib") is None:   # a course run from its clone, not installed
        sys.path.append(os.path.dirname(here))           # (-I ignores PYTHONPATH)
    if cfg["confine"]:
        try:
            _confine(cfg)
        except OSError as e:
            print(f"sandbox: {e}", file=sys.stderr)
            os._exit(97)
    if argv[1] == "--probe":
        hidden = [h for h in cfg["hide"] if os.path.isdir(h) and os.listdir(h)]
        print(f"still visible: {hidden}" if hidden else "confined")
        return
    os.chdir(cfg["scratch"])
    _limits(cfg)
    _Child(cfg).serve(cfg["req"], cfg["rep"])


# ---------------------------------------------------------------------------------------------
# frames over pipes, with a deadline on the grader's side

def _write_all(fd, data, deadline):
    view = memoryview(data)
    while view:
        if deadline is not None:
            _wait(fd, deadline, write=True)
        try:
            n = os.write(fd, view[:1 << 16])
        except BlockingIOError:
            continue
        except BrokenPipeError:
            raise SandboxGone("exited") from None
        view = view[n:]


def _wait(fd, deadline, write=False):
    left = deadline - time.monotonic()
    if left > 0:
        readable, writable, _ = select.select([] if write else [fd], [fd] if write else [], [],
                                              left)
        if readable or writable:
            return
    raise SandboxTimeout()


def _read_exact(fd, n, deadline):
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            _wait(fd, deadline)
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_frame(fd, deadline, limit=None):
    head = _read_exact(fd, _HEADER, deadline)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if limit is not None and size > limit:
        raise SandboxGone(f"garbled reply ({size} bytes announced): did the file write to the "
                          "grader's pipe?")
    data = _read_exact(fd, size, deadline)
    if data is None:
        return None
    return data


# ---------------------------------------------------------------------------------------------
# the grader's side

_UNSHARE = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--net",
            "--ipc"]


def _command(cfg):
    cmd = [sys.executable, "-I", "-B", os.path.abspath(__file__)]
    if cfg["confine"]:
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        cmd = _UNSHARE + user + ["--"] + cmd
    return cmd


def probe(root, hide):
    """"namespaces" if confinement works on this machine, else "none" (with the reason)."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return "none", "no Linux namespaces (unshare) here"
    run_dir = tempfile.mkdtemp(prefix="flashlib-probe-")
    try:
        cfg = dict(confine=True, scratch=os.path.join(run_dir, "s"), run_dir=run_dir,
                   hide=[str(h) for h in hide], root=str(root), disk="1m")
        os.makedirs(cfg["scratch"])
        r = subprocess.run(_command(cfg) + ["--probe", json.dumps(cfg)], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
        if r.returncode == 0 and r.stdout.strip() == "confined":
            return "namespaces", ""
        return "none", (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
    except (OSError, subprocess.SubprocessError) as e:
        return "none", str(e)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


class Sandbox:
    """One student process for one exercise file; ``files`` are the student's folder
    ({relative path: bytes}), ``file`` the one to load. Everything it does counts against
    ``deadline`` (time.monotonic()); past it, SandboxTimeout; if it dies, SandboxGone."""

    def __init__(self, files, file, *, run_dir, deadline, confine, hide, protect, root, memory,
                 fsize=16 << 20, disk="64m", env=None):
        self.deadline, self.tail, self.output_bytes = deadline, bytearray(), 0
        self.scratch = tempfile.mkdtemp(dir=run_dir)
        for rel, data in files.items():
            path = os.path.join(self.scratch, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        req_r, self.req = os.pipe()
        self.rep, rep_w = os.pipe()
        cpu = max(1, int(deadline - time.monotonic()) + 1)
        cfg = dict(confine=confine, scratch=self.scratch, run_dir=run_dir, file=file,
                   hide=[str(h) for h in hide], protect=[str(p) for p in protect],
                   root=str(root), disk=disk, memory=memory,
                   fsize=fsize, cpu=cpu, req=req_r, rep=rep_w)
        env = dict(env or {}, HOME=self.scratch, TMPDIR=self.scratch,
                   TRITON_CACHE_DIR=os.path.join(self.scratch, ".triton"))
        try:
            self.proc = subprocess.Popen(_command(cfg) + ["--child", json.dumps(cfg)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, pass_fds=(req_r, rep_w),
                                         cwd=self.scratch, env=env, start_new_session=True)
        finally:
            os.close(req_r)
            os.close(rep_w)
        os.set_blocking(self.req, False)
        self._drain = threading.Thread(target=self._read_output, daemon=True)
        self._drain.start()

    def _read_output(self):
        """Keep the last 4 kB of what the student process prints; drop the rest."""
        try:
            for chunk in iter(lambda: self.proc.stdout.read1(1 << 16), b""):
                self.output_bytes += len(chunk)
                self.tail = (self.tail + chunk)[-4096:]
        except (OSError, ValueError):
            pass

    def last_line(self):
        if self.proc.poll() is not None:          # exited: let the reader catch up
            self._drain.join(timeout=1)
        lines = self.tail.decode("utf-8", "replace").strip().splitlines()
        return lines[-1][:200] if lines else "no output"

    def request(self, message, extra=None):
        """Send a message, wait for the reply; copy changed arrays and storages back."""
        frame, encoder = encode(message, extra=extra)
        try:
            _write_all(self.req, frame, self.deadline)
        except SandboxGone:
            data = None
        else:
            data = _read_frame(self.rep, self.deadline, MAX_REPLY)
        if data is None:
            raise SandboxGone("exited", self._exit_code())
        try:
            reply, _ = decode(data, restricted=True, storages=encoder.objects)
            if not isinstance(reply, dict):
                raise TypeError("not a dict")
            self._copy_back(reply, encoder.objects)
        except Exception as e:
            raise SandboxGone(f"a reply the grader cannot read ({type(e).__name__}: {e})") from e
        return reply

    @staticmethod
    def _copy_back(reply, objects):
        """Write what the call changed into the grader's own arrays and tensor storages."""
        import numpy as np
        for key, kind in (("arrays", np.ndarray), ("storages", None)):
            for i, data in reply.get(key, {}).items():
                target = objects[i]
                if not isinstance(data, bytes) or isinstance(target, np.ndarray) != bool(kind):
                    raise TypeError(f"bad {key} entry {i}")
                if kind is not None:
                    if target.flags.writeable:
                        target[...] = np.frombuffer(data, dtype=target.dtype).reshape(target.shape)
                    continue
                torch = _torch()
                if len(data) != target.nbytes():
                    raise ValueError("a storage changed size")
                flat = torch.empty(0, dtype=torch.uint8, device=target.device).set_(target)
                flat.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(target.device))

    def _exit_code(self):
        try:
            return self.proc.wait(timeout=max(0.1, min(5.0, self.deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for fd in (self.req, self.rep):
            os.close(fd)
        self._drain.join(timeout=1)
        self.proc.stdout.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# proxies: what the graders see as the student's module

class _Function:
    """A plain function of the student's file; calling it runs it in the student process."""

    def __init__(self, student, name):
        self._student, self.__name__, self.__qualname__ = student, name, name

    def __call__(self, *args, **kwargs):
        return self._student.call(self.__name__, args, kwargs)

    def __repr__(self):
        return f"<the student's {self.__name__}>"


_KERNEL_CLASS = None


def _kernel_class():
    """A KernelInterface subclass (built once Triton is imported) standing for a student's
    @triton.jit function; installs the routing of launches that receive one."""
    global _KERNEL_CLASS
    if _KERNEL_CLASS is None:
        from triton.runtime.jit import KernelInterface

        class StudentKernel(KernelInterface):
            def __init__(self, student, name, fn):
                self._student, self.fn, self.__name__ = student, fn, name

            def run(self, *args, grid, warmup, **kwargs):
                return None if warmup else self._student.launch(self, grid, args, kwargs)

            def __call__(self, *args, **kwargs):
                raise RuntimeError(f"{self.__name__} runs only inside a kernel")

        _route_launches(KernelInterface, StudentKernel)
        _KERNEL_CLASS = StudentKernel
    return _KERNEL_CLASS


def _route_launches(base, skip):
    """Wrap ``run`` of every KernelInterface class: a launch with a student's kernel among its
    arguments goes to that student's process."""
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        original = cls.__dict__.get("run")
        if cls is skip or original is None or getattr(original, "_routed", False):
            continue

        def run(self, *args, grid, warmup, _original=original, **kwargs):
            student = next((a._student for a in (*args, *kwargs.values())
                            if isinstance(a, skip)), None)
            if student is None:
                return _original(self, *args, grid=grid, warmup=warmup, **kwargs)
            return None if warmup else student.launch(self, grid, args, kwargs)
        run._routed = True
        cls.run = run


class Student:
    """The grader's handle on one loaded submission: ``impl`` for the graders, ``flags`` (what
    the student process reported: forbidden reads, foreign functions, patched libraries)."""

    def __init__(self, box, display_path, text):
        self.box, self.path, self.text, self.flags = box, display_path, text, []

    def load(self, preload):
        """Import the file there; returns the reply ({"status": "ok" | "not done" | "error"})."""
        reply = self._checked(self.box.request({"op": "load", "preload": preload}))
        if reply.get("status") not in ("ok", "not done", "error"):
            raise SandboxGone("a load reply the grader cannot read")
        if reply["status"] != "ok":
            return reply
        import linecache
        linecache.cache[self.path] = (len(self.text), None, self.text.splitlines(True), self.path)
        members = {}
        try:
            for name, info in dict(reply["names"]).items():
                if not str(name).isidentifier() or name.startswith("__"):
                    continue
                if info[0] == "function":
                    members[name] = _Function(self, name)
                elif info[0] == "value":
                    members[name] = info[1]
                elif info[0] == "jit":
                    members[name] = _kernel_class()(self, name, self._stand_in(name, *info[1:]))
        except (TypeError, ValueError, IndexError, KeyError) as e:
            raise SandboxGone(f"a load reply the grader cannot read ({e})") from None
        self.impl = types.SimpleNamespace(__file__=self.path, **members)
        return reply

    def _checked(self, reply):
        """Keep the reply's well-formed flags (a list of tuples of strings)."""
        flags = reply.get("flags", [])
        self.flags += [tuple(str(x) for x in f) for f in (flags if isinstance(flags, list) else [])
                       if isinstance(f, (tuple, list)) and f]
        return reply

    def _stand_in(self, name, params, firstlineno):
        """A plain function with the student's signature whose source is the student's."""
        def stand_in(*args, **kwargs):
            raise RuntimeError(f"{name} runs in the student's process")
        stand_in.__code__ = stand_in.__code__.replace(co_filename=self.path, co_name=name,
                                                      co_firstlineno=int(firstlineno))
        stand_in.__name__ = stand_in.__qualname__ = name
        kind = type(inspect.Parameter.POSITIONAL_ONLY)
        stand_in.__signature__ = inspect.Signature(
            [inspect.Parameter(str(p), kind(int(k))) for p, k in params])
        return stand_in

    def _extra(self, obj):
        if isinstance(obj, (_Function, _kernel_class())) and obj._student is self:
            return ("student", obj.__name__)
        return None

    def _answer(self, reply):
        self._checked(reply)
        if "error" in reply:
            raise _rebuild(reply["error"], self.path)
        return reply.get("result")

    def call(self, name, args, kwargs):
        return self._answer(self.box.request(
            {"op": "call", "name": name, "args": args, "kwargs": kwargs}, extra=self._extra))

    def launch(self, kernel, grid, args, kwargs):
        if isinstance(kernel, _kernel_class()):
            ref = ("student", kernel.__name__)
            fn = kernel.fn
        else:
            fn = kernel
            while not isinstance(fn, types.FunctionType):
                fn = fn.fn
            names = [k for k, v in fn.__globals__.items() if v is kernel]
            if not names:
                raise RuntimeError(f"cannot route a launch of {fn.__qualname__}")
            path = fn.__globals__.get("__file__")
            grader = fn.__globals__.get("__name__", "").startswith("_flashlib_grader")
            text = "".join(__import__("linecache").getlines(path)) if grader else None
            ref = ("global", path, fn.__globals__["__name__"], names[0], text)
        if callable(grid):
            bound = inspect.signature(fn).bind_partial(
                *args, **{k: v for k, v in kwargs.items() if k in inspect.signature(fn).parameters})
            bound.apply_defaults()
            grid = grid({**bound.arguments, **kwargs})
        grid = tuple(int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,)))
        return self._answer(self.box.request(
            {"op": "launch", "kernel": ref, "grid": grid, "args": args, "kwargs": kwargs},
            extra=self._extra))

    def finish(self):
        reply = self._checked(self.box.request({"op": "finish"}))
        patched = reply.get("patched", [])
        self.flags += [("patch", str(p)) for p in (patched if isinstance(patched, list) else [])]


_SAFE_ERRORS = {name: cls for name, cls in vars(builtins).items()
                if isinstance(cls, type) and issubclass(cls, Exception)}


def _rebuild(error, path):
    """An exception of a builtin class (else RuntimeError) carrying the student's message."""
    if not isinstance(error, dict):
        return RuntimeError("the student process sent a malformed error")
    name, message = str(error.get("type")), str(error.get("message"))
    where = f" ({os.path.basename(path)}, line {error['line']})" if error.get("line") else ""
    cls = _SAFE_ERRORS.get(name)
    if cls is None:
        return RuntimeError(f"{name}: {message}{where}")
    try:
        return cls(f"{message}{where}")
    except Exception:
        return RuntimeError(f"{name}: {message}{where}")


if __name__ == "__main__":
    _child_main(sys.argv)
