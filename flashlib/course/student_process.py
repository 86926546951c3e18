"""The student process of ``flashlib grade``: load one student's file, answer calls.

Run as a plain script by ``flashlib.course.sandbox`` (``python -I -B student_process.py --child
CONFIG``), under bubblewrap when it can (``flashlib.course.bwrap``), it sets its resource limits
(``limits``), imports the student's file and serves
the grader's requests over two pipes (``_Child.serve``): call a function of the file, launch
a Triton kernel with the student's ``@triton.jit`` function plugged in, or apply one of
flashlib's functions to the student's objects (exercise 12c's record of a Gluon function's
calls). It answers with outputs, never a grade, and reports every library function the file
patched (``_Child._patched``). ``flashlib.course.sandbox``'s docstring says what is and is not
prevented. Imports nothing of flashlib before the student's file asks for it (or the grader's
``PRELOAD`` does), except ``wire.py`` beside it, loaded by path.
"""
import inspect
import json
import os
import sys
import traceback
import types

try:
    from .wire import decode, encode, read_frame, storage_bytes, write_all
except ImportError:   # run as a script: load wire.py beside this file, not the package
    import importlib.util

    def _beside(name):
        spec = importlib.util.spec_from_file_location(
            f"_flashlib_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    _wire = _beside("wire")
    decode, encode, read_frame, storage_bytes, write_all = (
        _wire.decode, _wire.encode, _wire.read_frame, _wire.storage_bytes, _wire.write_all)

_FS_EVENTS = {"open", "os.listdir", "os.scandir", "os.remove", "os.rmdir", "os.mkdir", "os.rename",
              "os.chmod", "os.chown", "os.truncate", "os.utime", "os.link", "os.symlink",
              "shutil.rmtree"}
_WATCHED = ("numpy", "numpy.testing", "numpy.linalg", "torch", "torch.testing",
            "torch.nn.functional", "triton", "triton.runtime.jit", "triton.runtime.interpreter",
            "math")

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
            mode, flags = ((args[1], args[2]) if event == "open"
                           else ("r" if event in ("os.listdir", "os.scandir") else "w", 0))
            write = ((isinstance(mode, str) and any(c in mode for c in "wax+"))
                     or (isinstance(flags, int) and flags & writing != 0))
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

    def _reference(self, pid):
        """What a persistent id of the grader's message names: a student's function, or one of
        flashlib's own @triton.jit functions (a constexpr of a launch, e.g. a kernel's SCORE_MOD)."""
        if pid[0] == "flashlib":
            _, module_name, attr = pid
            if str(module_name).split(".")[0] != "flashlib":
                raise ValueError(f"refusing {module_name}.{attr}")
            __import__(module_name)
            return getattr(sys.modules[module_name], attr)
        return self._student(pid)

    def _error(self, e):
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == self.path]
        builtin = next(c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins")
        return {"type": builtin, "message": str(e)[:2000], "line": lines[-1] if lines else None}

    def _kernel(self, ref):
        if ref[0] == "student":
            kernel = self._student(ref)
            if type(kernel).__module__.split(".")[0] != "triton":   # the student's own run()
                raise TypeError(f"{ref[1]} is not a @triton.jit function")
            return kernel
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
            data = read_frame(req, None)
            if data is None:
                return
            msg, decoder = decode(data, restricted=False, extra=self._reference)
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
            write_all(rep, frame, None)

    def _run(self, msg, decoder):
        before = {i: a.tobytes() for i, a in decoder.arrays.items()}
        stored = {i: storage_bytes(s) for i, s in decoder.new_storages.items()}
        reply = {}
        try:
            if msg["op"] == "call":
                fn = self._student(("student", msg["name"]))
                reply["result"] = fn(*msg["args"], **msg["kwargs"])
            elif msg["op"] == "apply":   # one of flashlib's functions, on the student's objects
                fn = self._reference(tuple(msg["function"]))
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
                             if (b := storage_bytes(s)) != stored[i]}
        return reply


def limits(cfg):
    """RLIMIT_DATA (writable private memory: not the PROT_NONE address space that CUDA and
    glibc's arenas reserve, nor shared mappings, which the grader's watchdog counts), file size,
    no core, CPU seconds, and (confined) RLIMIT_NPROC."""
    import resource
    for name, value in (("RLIMIT_DATA", cfg["memory"]), ("RLIMIT_FSIZE", cfg["fsize"]),
                        ("RLIMIT_CORE", 0), ("RLIMIT_CPU", cfg["cpu"]),
                        ("RLIMIT_NPROC", cfg.get("nproc"))):
        if value is not None:
            hard = value + 5 if name == "RLIMIT_CPU" else value
            resource.setrlimit(getattr(resource, name), (value, hard))


def _child_main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = json.loads(argv[2])
    sys.path[:] = [cfg["path"]] + [p for p in sys.path if os.path.abspath(p or ".") != here]
    os.chdir(cfg["scratch"])
    limits(cfg)
    _Child(cfg).serve(cfg["req"], cfg["rep"])


if __name__ == "__main__":
    _child_main(sys.argv)
