"""What a grader file imports to write its checks (``tests/exercises/test_exNN_topic.py``).

A check is a plain function ``check(impl, rng)`` (impl: the learner's module, rng: a seeded
NumPy generator) that raises ``CheckFailed`` with words a learner can act on. The helpers here
say what went wrong: ``fail`` (a message and a hint), ``expect_close`` (flashlib.testing's
tolerance, and which entries differ), ``function``, ``jit_kernel`` and ``as_array`` (the
learner's function or Triton kernel and what it returned, or a message naming what is missing),
``expect_every_program_ran`` (a grader's harness kernel saw the learner's body run everywhere);
``inputs_kept`` gives copies of the inputs taken before a call (references come from them) and
fails if the call changed them;
``ReadRecorder`` with ``stream_problem`` tell one streaming pass from two, ``memory_problem`` a
loop that keeps O(1) state from one that keeps every block. (``flashlib.course.grading``'s
``check_id`` and ``pytest_run`` run the checks under pytest as ``flashlib check`` runs them.)

Limits: ``ReadRecorder`` sees only the accesses made through it, and ``peak_allocation`` only what
tracemalloc traces in this process (Python objects and NumPy's buffers, not torch's); under
``flashlib grade`` the learner's functions are proxies in another process, so memory checks are
marked ``not_under_grade`` and left out there.
"""
import contextlib
import inspect
import types

import numpy as np

from .files import display_path
from ..testing import assert_close, tolerance


class CheckFailed(AssertionError):
    """A grader check failed; its message is what the learner reads."""


def fail(message: str, hint: str | None = None):
    """Raise CheckFailed with ``message`` and an optional hint on its own line."""
    raise CheckFailed(message if hint is None else f"{message}\n    hint: {hint}")


def expect_close(actual, expected, *, baseline, dtype, name, hint=None, magnitude=None):
    """``flashlib.testing.assert_close`` with a hint; ``hint`` may be a callable (a diagnosis
    that runs only when the comparison fails) returning a string or None. magnitude: see
    ``flashlib.testing.tolerance``."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        fail(f"{name} has shape {actual.shape}, expected {expected.shape}", _resolve(hint))
    try:
        assert_close(actual, expected, baseline=baseline, dtype=dtype, name=name,
                     magnitude=magnitude)
    except AssertionError as e:
        bad = "" if np.all(np.isfinite(actual) | ~np.isfinite(expected)) else " (it has inf/NaN)"
        tol = tolerance(expected, baseline, dtype, magnitude=magnitude)
        fail(f"{e}{bad}\n    {where_it_differs(actual, expected, tol)}", _resolve(hint))


def _distinct(a: float, e: float) -> tuple[str, str]:
    """a and e with the fewest digits (6, 9 or 17) that tell them apart."""
    for digits in (6, 9, 17):
        shown = f"{a:.{digits}g}", f"{e:.{digits}g}"
        if shown[0] != shown[1]:
            break
    return shown


def where_it_differs(actual, expected, tol: float) -> str:
    """Which entries are off and how: how many, the rows (second-to-last axis) they sit in, and
    the worst one's index with the returned and expected values."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where(a == e, 0.0, np.abs(a - e))
    diff = np.where(np.isnan(diff), np.inf, diff)
    off = diff > tol
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    shown = _distinct(float(a[worst]), float(e[worst]))
    text = f"{int(off.sum())} of {off.size} entries off"
    if a.ndim >= 2:
        rows = np.flatnonzero(off.any(axis=-1).reshape(-1, a.shape[-2]).any(axis=0))
        listed = ", ".join(str(r) for r in rows[:8]) + (", ..." if len(rows) > 8 else "")
        text += f", in rows {listed} (of {a.shape[-2]})"
    return f"{text}; worst at index {tuple(int(i) for i in worst)}: returned {shown[0]}, expected {shown[1]}"


@contextlib.contextmanager
def inputs_kept(what, **inputs):
    """``with inputs_kept("your kernel", x=x) as kept:`` yields copies of the inputs (torch
    tensors or NumPy arrays), taken before the call, to compute the references from; after the
    block, a CheckFailed if the call changed any input in place (a learner's code that rewrites
    its inputs to match a wrong output, e.g. ``x.zero_()`` then a constant softmax)."""
    kept = {name: x.clone() if hasattr(x, "clone") else np.array(x, copy=True)
            for name, x in inputs.items()}
    yield kept
    for name, x in inputs.items():
        before, now = kept[name], x
        same = (before.equal(now) or bool(((before == now) | (before.isnan() & now.isnan())).all())
                if hasattr(now, "clone") else np.array_equal(before, now, equal_nan=True))
        if not same:
            fail(f"{what} changed its input {name} in place",
                 "write only the output: the inputs must be left as they were")


def _resolve(hint):
    return hint() if callable(hint) else hint


def function(impl, name: str):
    """The learner's function ``name``, or a CheckFailed saying it is missing."""
    fn = getattr(impl, name, None)
    if not callable(fn):
        fail(f"{display_path(getattr(impl, '__file__', 'your file'))} defines no function {name}: "
             "keep the name and signature from the stub")
    return fn


HINT_NOT_RUN = ("the grader runs the body of your @triton.jit function in every program of the "
               "grid; keep the stub's decorator, compute in the body, and leave the kernel "
               "object as Triton made it")
LAUNCH_ATTRIBUTES = ("run", "__getitem__", "__call__", "rewrite", "warmup")   # what a launch goes through


def jit_kernel(impl, name: str, exercise: str, params: int | None = None):
    """The learner's ``@triton.jit`` function ``name``, or a CheckFailed: missing, a plain Python
    function, not Triton's own kernel object (a class of the learner's, or a launch attribute
    replaced: a torch one-liner behind ``kernel[grid]``; checked where ``impl`` is the learner's
    module, under ``flashlib grade`` the grader's harness alone holds), or taking other than
    ``params`` arguments (None: any). NotImplementedError while its source still raises it (the
    stub)."""
    from triton.runtime.jit import KernelInterface
    fn = getattr(impl, name, None)
    if fn is None:
        fail(f"your file defines no {name}: keep the name and signature from the stub")
    if not isinstance(fn, KernelInterface):
        fail(f"{name} is a plain Python function: keep its @triton.jit decorator")
    if isinstance(impl, types.ModuleType):
        replaced = [a for a in LAUNCH_ATTRIBUTES if a in vars(fn)]
        if type(fn).__module__.split(".")[0] != "triton" or replaced:
            what = (f"its {', '.join(replaced)} replaced" if replaced
                    else f"a {type(fn).__name__} of your own")
            fail(f"your {name} does not run its body when launched ({what})", HINT_NOT_RUN)
    body = getattr(fn, "fn", fn)
    if "raise NotImplementedError" in inspect.getsource(body):
        raise NotImplementedError(f"{exercise}: {name} is still the stub")
    count = len(inspect.signature(body).parameters)
    if params is not None and count != params:
        fail(f"{name} takes {count} arguments; keep the stub's signature ({params})")
    return fn


def expect_every_program_ran(ran, name: str, grid):
    """Fail unless every program of ``grid`` marked its slot of ``ran`` (a tensor of zeros, one
    slot a program, that a grader's harness kernel sets to 1 after calling the learner's kernel
    ``name``: a body replaced by a torch one-liner behind ``kernel[grid]`` never runs there)."""
    done = int((ran == 1).sum())
    if done != ran.numel():
        fail(f"your {name} ran in {done} of the {ran.numel()} programs of its grid {tuple(grid)}",
             HINT_NOT_RUN)


def beside(learner_object, function, *args):
    """``function(learner_object, *args)`` where the learner's code runs: here under `flashlib
    check`, in the student process under `flashlib grade` (whose proxies cannot run a function
    that reads the learner's code, e.g. ``flashlib.teach.mbarrier.record``). ``function``: one of
    flashlib's own; its result must be plain data (numbers, strings, tuples, lists)."""
    student = getattr(learner_object, "_student", None)
    if student is None:
        return function(learner_object, *args)
    return student.apply(function, (learner_object, *args), {})


def as_array(x, name: str):
    """np.asarray(x), or a CheckFailed naming what came back instead of an array."""
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        fail(f"{name} should be a NumPy array, got {type(x).__name__}")


class ReadRecorder(np.lib.mixins.NDArrayOperatorsMixin):
    """An array stand-in that records which positions along ``axis`` each access reads, so a
    grader can tell one streaming pass (blocks, in order, each read once) from two passes or a
    whole-row computation. Indexing (``x[..., a:b]``, ``k[j]``) and iteration (axis 0) read what
    they select; anything else (a NumPy function or operator on it, ``np.asarray``, ``.T``,
    ``.max()``) reads everything. ``shape``, ``dtype``, ``ndim``, ``size`` and ``len`` read nothing.
    ``reads``: one sorted array of positions per access."""

    def __init__(self, array, axis):
        self._a, self._axis = np.asarray(array), axis % np.ndim(array)
        self.reads = []
        self.shape, self.dtype, self.ndim, self.size = (self._a.shape, self._a.dtype,
                                                        self._a.ndim, self._a.size)

    def _all(self):
        self.reads.append(np.arange(self._a.shape[self._axis]))

    def __len__(self):
        return len(self._a)

    def __getitem__(self, index):
        index = index._a if isinstance(index, ReadRecorder) else index
        shape = [1] * self._a.ndim
        shape[self._axis] = -1
        where = np.broadcast_to(np.arange(self._a.shape[self._axis]).reshape(shape), self._a.shape)
        self.reads.append(np.unique(where[index]))
        return self._a[index]

    def __iter__(self):
        if self._axis != 0:
            self._all()
            yield from self._a
            return
        for i in range(len(self._a)):
            self.reads.append(np.array([i]))
            yield self._a[i]

    def __array__(self, dtype=None, copy=None):
        self._all()
        return self._a if dtype is None else self._a.astype(dtype)

    @staticmethod
    def _plain(x):
        if isinstance(x, ReadRecorder):
            x._all()
            return x._a
        if isinstance(x, (tuple, list)):
            return type(x)(ReadRecorder._plain(t) for t in x)
        return x

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs, kwargs = self._plain(inputs), {k: self._plain(v) for k, v in kwargs.items()}
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return func(*self._plain(args), **{k: self._plain(v) for k, v in kwargs.items()})

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_a", "_axis", "reads"):
            raise AttributeError(name)
        self._all()
        return getattr(self._a, name)


def stream_problem(reads, n, most, what="columns") -> str | None:
    """What is not one streaming pass in ``reads`` (ReadRecorder.reads over ``n`` positions):
    an access reading more than ``most`` positions, or one going back before the block the
    previous access started at (a second pass); None when it streams."""
    start = -1
    for i, r in enumerate(reads):
        if r.size > most:
            return (f"step {i + 1} reads {r.size} of the {n} {what} at once (at most {most} "
                    "were expected)")
        if r.size and r.min() < start:
            return (f"step {i + 1} goes back to {what[:-1]} {int(r.min())} after a step that "
                    f"started at {start}: a second pass over the {what}")
        start = max(start, int(r.min()) if r.size else start)
    return None


def peak_allocation(fn, *args, **kwargs) -> int:
    """Bytes ``fn(*args, **kwargs)`` holds at its peak beyond what was allocated before the call
    (tracemalloc: Python objects and NumPy's buffers). Run it at two sizes of the input: an
    algorithm that keeps O(block) state holds the same at both, one that keeps every block (or
    every score) until the end holds more in proportion."""
    import tracemalloc

    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if started:
            tracemalloc.stop()


def not_under_grade(check_fn):
    """Mark a check that cannot run under ``flashlib grade``: it measures the learner's memory in
    this process, and there the learner's code runs in another. ``grade`` leaves it out of the
    exercise's checks and total (``under_grade``), so it counts neither as passed nor as failed;
    ``flashlib check`` and pytest run it."""
    check_fn.under_grade = False
    return check_fn


def under_grade(checks) -> list:
    """The checks ``flashlib grade`` runs and counts (all but ``not_under_grade`` ones)."""
    return [c for c in checks if getattr(c, "under_grade", True)]


def memory_problem(fn, make_args, sizes, per_position, what="columns") -> str | None:
    """Why ``fn`` is not O(1) in memory along the streamed axis, or None. make_args(n): the
    arguments for an input of n positions; sizes: (small, large); per_position: the bytes one
    position of the input holds (so that a buffer of the input is its own size in bytes). A
    growth by more than a tenth of the extra input is a buffer (a correct stream grows by 0)."""
    small, large = sizes
    peaks = [peak_allocation(fn, *make_args(n)) for n in (small, large)]
    growth = peaks[1] - peaks[0]
    if growth > 0.1 * (large - small) * per_position:
        return (f"your memory grows with the number of {what}: {peaks[0] / 1024:.0f} KiB at "
                f"its peak for {small} {what}, {peaks[1] / 1024:.0f} KiB for {large}")
    return None


# Reads a Triton kernel makes through the interpreter (ex05b's and ex07b's graders)

@contextlib.contextmanager
def loads_recorded():
    """While active, every tl.load that Triton's interpreter runs in this process appends the
    addresses (bytes) its mask lets through to the yielded list; yields None where loads cannot be
    seen (a kernel compiled for a GPU, or tensors not in this process's CPU memory)."""
    from triton.runtime import interpreter

    from .. import runtime

    builder = getattr(interpreter, "interpreter_builder", None)
    if not runtime.INTERPRET or runtime.DEVICE.type != "cpu" or not hasattr(builder, "create_masked_load"):
        yield None                                        # (another Triton's interpreter: unseen)
        return
    loads, original = [], builder.create_masked_load      # create_load calls it too

    def masked_load(ptrs, mask, *args, **kwargs):
        where = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data))
        loads.append(np.asarray(ptrs.data)[where].astype(np.uint64).ravel())
        return original(ptrs, mask, *args, **kwargs)

    builder.create_masked_load = masked_load
    try:
        yield loads
    finally:
        del builder.create_masked_load                    # back to the class's method


def element_addresses(t):
    """The byte address of every element of the view t, as a flat uint64 array."""
    index = np.zeros((), dtype=np.int64)
    for size, stride in zip(t.shape, t.stride()):
        index = index[..., None] + np.arange(size, dtype=np.int64) * stride
    return (t.data_ptr() + t.element_size() * index).ravel().astype(np.uint64)
