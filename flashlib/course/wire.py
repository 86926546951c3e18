"""The wire between the grader and a student process (``flashlib grade``, ``flashlib.course.sandbox``).

A message is a pickle in a length-prefixed frame. NumPy arrays, NumPy scalars and torch tensors
travel as raw bytes with dtype, shape, strides and storage offset (persistent ids), so a tensor
that is a view into a larger buffer arrives as one, and what a call changed in place can be sent
back. The grader decodes replies with ``restricted=True``: an unpickler that builds only plain
data and arrays, never a class or code. Frames are written and read with a deadline on the
grader's side (``SandboxTimeout`` past it, ``SandboxGone`` when the other side is gone or garbles
the pipe). Standard library only (torch and NumPy are used if the process has imported them):
the student process loads this file by path, before anything else of flashlib.
"""
import io
import math
import os
import pickle
import select
import sys
import time

MAX_REPLY = 32 << 20           # bytes: a larger reply from the student process is refused
_HEADER = 4


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
                ref = ("buf", self._register(("ts", key), storage, storage_bytes(storage)))
            return ("ts", ref, str(obj.dtype).removeprefix("torch."), obj.device.type,
                    obj.storage_offset(), tuple(obj.shape), tuple(obj.stride()))
        return self.extra(obj) if self.extra is not None else None


def storage_bytes(storage):
    torch = _torch()
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return flat.cpu().numpy().tobytes()


def _storage_from(data, device):
    torch = _torch()
    flat = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
            else torch.empty(0, dtype=torch.uint8))
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
        self.elements = 0                   # of every array and tensor view, each reference

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
            self._count(self.arrays[i].size, self.arrays[i].shape)
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
            size, stride = tuple(int(n) for n in size), tuple(int(n) for n in stride)
            if any(n < 0 for n in size) or any(st < 0 for st in stride):
                raise pickle.UnpicklingError(f"a tensor of shape {size} and strides {stride}")
            self._count(math.prod(size), size)
            return torch.empty(0, dtype=dtype, device=storage.device).set_(
                storage, int(offset), size, stride)
        if kind in ("student", "flashlib") and self.extra is not None:
            return self.extra(pid)
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")

    def _count(self, numel, shape):
        """Refuse a reply whose arrays and tensor views show more than MAX_ELEMENTS elements in
        all (restricted only): views of one small storage, repeated, are a few bytes on the wire
        and gigabytes once the grader computes with them."""
        self.elements += numel
        if self.restricted and self.elements > MAX_ELEMENTS:
            raise pickle.UnpicklingError(
                f"a reply showing more than {MAX_ELEMENTS} elements in its arrays and tensors "
                f"(one of shape {tuple(shape)}): too large once rebuilt")


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
    if (not isinstance(body, bytes) or not isinstance(buffers, list)
            or not all(isinstance(b, bytes) for b in buffers)):
        raise pickle.UnpicklingError("malformed frame")
    decoder = _Decoder(io.BytesIO(body), buffers, restricted=restricted, storages=storages,
                       extra=extra)
    message = decoder.load()
    if restricted:
        _check_size(message)
    return message, decoder


MAX_ITEMS = 1 << 20         # container entries a reply may hold, counting each reference
MAX_DEPTH = 64              # how deeply its containers may nest
MAX_ELEMENTS = 1 << 24      # elements of all the arrays and tensor views of one reply together


def _check_size(message) -> None:
    """Refuse a reply whose containers are too many or too deep once expanded: pickle shares
    repeated objects, so ``[[[0] * 10] * 10] * ...`` is a few hundred bytes on the wire and
    gigabytes as the grader walks it. Each reference counts; the walk stops at the budget."""
    count, stack = 0, [(message, 0)]
    while stack:
        obj, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise pickle.UnpicklingError(f"a reply nested more than {MAX_DEPTH} deep")
        if isinstance(obj, dict):
            items = [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = obj
        else:
            continue
        count += len(items)
        if count > MAX_ITEMS:
            raise pickle.UnpicklingError(f"a reply of more than {MAX_ITEMS} items once expanded")
        stack.extend((item, depth + 1) for item in items)


# ---------------------------------------------------------------------------------------------
# frames over pipes, with a deadline on the grader's side

def write_all(fd, data, deadline):
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


def frame(data: bytes) -> bytes:
    """``data`` with its length in front, as ``read_frame`` reads it."""
    return len(data).to_bytes(_HEADER, "big") + data


def read_frame(fd, deadline, limit=None):
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
