"""The grader's side of ``flashlib grade``: one student's file in a confined process, called by proxy.

``flashlib grade`` (``flashlib.course.classroom``) grades in two processes per student and exercise:

- the **grader** (trusted) loads the exercise's grader and runs its checks ``check(impl, rng)``
  itself: references, tolerances, comparisons and the verdict never leave it;
- the **student process** (``flashlib.course.student_process``, run as a plain script:
  ``python -I -B student_process.py --child``) imports the student's file and does only what the
  grader asks over two pipes: call a function of the file with given arguments, or launch a
  Triton kernel with the student's ``@triton.jit`` function plugged in. It answers with outputs, never with a grade: what it prints, forges or
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
tensors, which come back afterwards. A check that must read the student's code itself (ex12c's
log of a Gluon function's calls) asks for one of flashlib's own functions to be applied to the
student's objects there (``Student.apply``, ``checks.beside``); only plain data comes back.
So on the Triton exercises (ex06, ex07) the *launch* runs in
the student's process, with its copy of flashlib and Triton: a student who patches those could
fake a kernel's output. The student process therefore compares, after import and at the end,
the functions and classes of flashlib, numpy, torch and Triton's runtime with a snapshot taken
before the import, and reports every change; the grader then refuses the file. flashlib's own
answers to the exercise are not in the copy it imports (below), however the file reaches for
them (``pkgutil.resolve_name``, re-executing a module's source). Replies are
decoded with an unpickler that builds only plain data and arrays (no classes, no code).

Confinement (``flashlib.course.bwrap``, where ``probe`` finds it works): the student process
runs under bubblewrap in a fresh filesystem holding only /usr and the Python runtime (read-only),
a copy of flashlib whose graded answers are removed from the files (``copies.flashlib_copy``:
every name of the grader's FLASHLIB_ANSWERS, so a file reloading flashlib's source finds
nothing), and its scratch folder (a size-limited tmpfs holding the submission; cwd, HOME and
TMPDIR point there); every namespace unshared, no capabilities, a seccomp filter refusing Unix
sockets, SysV IPC, ptrace, keyrings and new user namespaces; as nobody (``bwrap``'s docstring
says how, for root and for an ordinary instructor). Otherwise ``grade`` refuses to run unless
asked (``--unconfined``); asked, the student process runs as the grader's user, with the answers'
copy first on its path: nothing stops it reading or writing where that user can, and an audit
hook that refuses reads of solutions/, tests/ and the class folder can be bypassed (ctypes,
subprocesses).

Limits. Per process (set inside it, ``student_process.limits``): RLIMIT_DATA (writable private
memory; not RLIMIT_AS, which the address space CUDA and glibc's arenas reserve would exhaust),
CPU seconds, file size, RLIMIT_NPROC (NPROC processes and threads, counted in the sandbox's own
user namespace); MALLOC_ARENA_MAX=2. Across the student's processes,
the grading process (``processes.supervise``) looks every 0.1 s at the memory they hold together
(``processes.memory_in_use``: anonymous and shared pages, proportional shares for pages a fork shares,
memfd files) and kills them all past the limit; it also kills a grader process still busy a few
seconds past the file's wall-clock limit (a reply crafted to make the grader's own comparison
slow), so every file ends at its limit. The sandbox ends with its process group (confined: the
whole PID namespace, daemons and forks included; bwrap dies with the grader).
``flashlib.course.classroom`` also hashes the class folder before and after and restores what
changed. Not prevented when confined: using the CPU until the time limit, memory the kernel
keeps for the student (pipe buffers, a 16 MB /dev/shm), reading the Python runtime and /usr.
Unconfined: reads and writes where the instructor can, processes that leave the session, fork
bombs, signals to the grader's processes.
``flashlib grade`` runs kernels through Triton's interpreter, also on GPU machines (no GPU
device is in the sandbox). Autotuning is off (``FLASHLIB_AUTOTUNE=0``) so that the grader
resolves every grid.
"""
import builtins
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types

from . import bwrap
from .student_process import module_from_source  # noqa: F401  (classroom loads graders with it)
from .wire import MAX_REPLY, SandboxGone, decode, encode, read_frame, write_all
from .wire import SandboxTimeout  # noqa: F401  (what a grader catches: the sandbox's API)

NPROC = 64        # processes and threads a confined student process may have
_HERE = os.path.dirname(os.path.abspath(__file__))


def probe():
    """How student processes can run here: (mode, why): ("bubblewrap", "") confined, or
    ("none", why not)."""
    why = bwrap.probe()
    return ("none", why) if why else ("bubblewrap", "")


class Sandbox:
    """One student process for one exercise file; ``files`` are the student's folder
    ({relative path: bytes}), ``file`` the one to load. Everything it does counts against
    ``deadline`` (time.monotonic()); past it, SandboxTimeout; if it dies, SandboxGone."""

    def __init__(self, files, file, *, run_dir, deadline, confine, hide, protect, memory,
                 course=None, fsize=16 << 20, disk=64 << 20, env=None, nproc=None):
        """course: a folder holding the flashlib copy the student sees (``copies``), else
        flashlib itself; confine: under bubblewrap (else as the grader's user, in a scratch
        folder under ``run_dir``)."""
        self.deadline, self.tail, self.output_bytes = deadline, bytearray(), 0
        package = os.path.dirname(_HERE)                           # flashlib/
        seen = os.path.join(course, "flashlib") if course else package
        self.scratch, fds = (None, ()) if confine else (tempfile.mkdtemp(dir=run_dir), ())
        scratch = "/scratch" if confine else self.scratch
        if not confine:
            for rel, data in files.items():
                path = os.path.join(scratch, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
        req_r, self.req = os.pipe()
        self.rep, rep_w = os.pipe()
        cpu = max(1, int(deadline - time.monotonic()) + 1)
        cfg = dict(scratch=scratch, file=file, path=os.path.dirname(package if confine else seen),
                   hide=[str(h) for h in hide], protect=[str(p) for p in protect],
                   memory=memory, fsize=fsize, cpu=cpu, req=req_r, rep=rep_w,
                   nproc=nproc if confine else None)
        env = dict(env or {}, HOME=scratch, TMPDIR=scratch, MALLOC_ARENA_MAX="2",
                   TRITON_CACHE_DIR=os.path.join(scratch, ".triton"))
        script = os.path.join(package if confine else seen, "course", "student_process.py")
        cmd = [sys.executable, "-I", "-B", script, "--child", json.dumps(cfg)]
        try:
            if confine:
                cmd, fds = bwrap.command(cmd, course={package: seen}, scratch=scratch,
                                         files=files, disk=disk, env=env, cwd=scratch)
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, pass_fds=(req_r, rep_w, *fds),
                                         cwd=scratch if not confine else None, env=env,
                                         start_new_session=True)
        finally:
            for fd in (req_r, rep_w, *fds):
                os.close(fd)
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
            write_all(self.req, frame, self.deadline)
        except SandboxGone:
            data = None
        else:
            data = read_frame(self.rep, self.deadline, MAX_REPLY)
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
                torch = sys.modules.get("torch")
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
        if self.scratch is not None:
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
        """Import the file there, after importing ``preload``; returns the reply ({"status":
        "ok" | "not done" | "error"})."""
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
        jit = sys.modules.get("triton.runtime.jit")
        if jit is not None and isinstance(obj, jit.KernelInterface):   # flashlib's own go by name
            module, name = obj.fn.__module__ or "", obj.fn.__name__
            if module.split(".")[0] == "flashlib" and getattr(sys.modules.get(module), name, None) is obj:
                return ("flashlib", module, name)
        return None

    def _answer(self, reply):
        self._checked(reply)
        if "error" in reply:
            raise _rebuild(reply["error"], self.path)
        return reply.get("result")

    def call(self, name, args, kwargs):
        return self._answer(self.box.request(
            {"op": "call", "name": name, "args": args, "kwargs": kwargs}, extra=self._extra))

    def apply(self, function, args, kwargs):
        """``function(*args, **kwargs)`` in the student process, ``function`` one of flashlib's own
        (by name), the student's objects among the arguments (what ``checks.beside`` sends)."""
        module, name = getattr(function, "__module__", "") or "", getattr(function, "__name__", "")
        if module.split(".")[0] != "flashlib" or getattr(sys.modules.get(module), name, None) is not function:
            raise ValueError(f"only flashlib's own functions run beside a student's code, not {function!r}")
        return self._answer(self.box.request(
            {"op": "apply", "function": ("flashlib", module, name), "args": args, "kwargs": kwargs},
            extra=self._extra))

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
