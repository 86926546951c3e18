"""Where a Triton kernel's time goes: what it was compiled to, how many of its programs fit on an
SM, and what a profiler trace says (lessons 05 and 07, ``tools/profile_kernels.py``).

- ``kernel_resources(compiled)``: a compiled kernel's registers per thread, spills, shared memory
  per program, warps and stages. On a GPU the registers and spills are the driver's figures
  (Triton's ``n_regs``, ``n_spills``, read once the kernel is loaded); elsewhere they are read off
  the kernel's machine code (cubin) with ``cuobjdump``, which Triton ships. Shared memory is
  Triton's own ``metadata.shared``. Works with Triton 3.6 (the GPU machines') and newer.
- ``occupancy(num_warps, registers_per_thread, shared_bytes, sm)``: programs (thread blocks)
  resident on one SM and the fraction of its warp slots they fill, by the rules of NVIDIA's CUDA
  occupancy calculator; it and ``SM_LIMITS`` live in ``teach/occupancy.py`` and are re-exported.
- ``captured_launches()``: the compiled kernel behind every Triton launch inside a ``with`` block
  (flashlib's launchers, a learner's kernel), so its resources can be read on a GPU.
- ``compile_in_child(code, gpu)``: compile the kernels that ``code`` launches for a GPU this
  machine may not have (Triton compiles for a named target anywhere), in a child process with
  Triton's interpreter off, and return their resources and occupancy: the lessons use it on a CPU.
- ``kernel_table(prof)``: a ``torch.profiler`` trace as rows of (kernel, calls, total and mean
  time, share): GPU kernels when the trace has them, else the CPU's operators.
- ``load_report()``: the committed GPU report of ``tools/profile_kernels.py``
  (``benchmarks/results/h100/profile/report.json``, else h200's), or None.

Limits: occupancy counts what fits, not what runs well: a kernel with few resident warps can still
keep its tensor cores busy, and the carve-out of the SM's 256 KB between L1 and shared memory is
taken at its largest. Resources compiled on a CPU come from the Triton installed here, which may
differ from the GPU machine's (compare the committed report's ``triton`` version).
"""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from .occupancy import BY_CAPABILITY, SM_LIMITS, Occupancy, SMLimits, occupancy, sm_limits

__all__ = ["SMLimits", "SM_LIMITS", "sm_limits", "Occupancy", "occupancy", "KernelResources",
           "kernel_resources", "cubin_resources", "parse_resource_usage", "captured_launches",
           "compile_in_child", "kernel_table", "format_table", "load_report", "REPORT_PLACES",
           "missing_report_message"]


# ---------------------------------------------------------------------------------------------
# a compiled kernel's resources

class KernelResources(NamedTuple):
    """What the compiler gave one kernel (per thread for registers and spills, per program for
    shared memory)."""
    name: str
    target: str                 # "sm90", ...
    num_warps: int
    num_stages: int
    registers: int | None       # 32-bit registers per thread (at most 255)
    spills: int | None          # Triton's n_spills: local memory per thread in 32-bit words
    shared: int                 # bytes of shared memory per program (Triton's metadata.shared)
    source: str                 # where registers and spills came from: "driver", "cuobjdump", "unknown"

    def occupancy(self, sm=None) -> Occupancy:
        """``occupancy`` of this kernel on ``sm`` (default: the GPU it was compiled for, an
        H100's limits for an architecture SM_LIMITS lacks)."""
        return occupancy(self.num_warps, self.registers, self.shared,
                         sm or BY_CAPABILITY.get(_capability(self.target), "h100"))


def _capability(target: str):
    digits = re.sub(r"\D", "", target)
    return (int(digits[:-1]), int(digits[-1])) if len(digits) >= 2 else None


def _arch(compiled) -> str:
    arch = compiled.metadata.target.arch
    return f"sm{arch}" if isinstance(arch, int) else str(arch)


def _tool(name):
    """Path of an NVIDIA tool Triton ships (cuobjdump, nvdisasm), else the one on PATH, else None."""
    try:
        from triton import knobs
        path = getattr(knobs.nvidia, name).path
        if path and os.path.exists(path):
            return path
    except Exception:     # older or newer Triton without this knob
        pass
    import triton
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(bundled) if bundled.exists() else shutil.which(name)


def parse_resource_usage(text: str, name: str | None = None) -> dict:
    """``cuobjdump --dump-resource-usage`` output -> {"registers", "stack", "local", "shared"} of
    function ``name`` (the first function if None). stack and local are bytes per thread (spilled
    registers live in the stack frame, in local memory); shared is static shared memory (on sm90
    every Triton kernel shows the runtime's 1 KB reserve here; Triton's own is dynamic)."""
    block = None
    for match in re.finditer(r"Function ([^:\s]+):\s*\n\s*(.*)", text):
        if name is None or match.group(1) == name:
            block = match.group(2)
            break
    if block is None:
        raise ValueError(f"no function {name!r} in the resource usage:\n{text[:500]}")
    fields = dict(re.findall(r"([A-Z]+)(?:\[\d+\])?:(\d+)", block))
    return {"registers": int(fields.get("REG", 0)), "stack": int(fields.get("STACK", 0)),
            "local": int(fields.get("LOCAL", 0)), "shared": int(fields.get("SHARED", 0))}


def cubin_resources(cubin: bytes, name: str | None = None, *, sass: bool = True) -> dict | None:
    """Resources of a kernel read off its cubin with cuobjdump: ``parse_resource_usage``'s dict,
    plus (``sass``) ``local_stores`` and ``local_loads``, the STL and LDL instructions in its
    machine code (register spills go through them). None if no cuobjdump is found."""
    tool = _tool("cuobjdump")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run([tool, "--dump-resource-usage", str(path)], capture_output=True,
                               text=True, timeout=60)
        found = parse_resource_usage(usage.stdout, name)
        if sass:
            code = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                                  timeout=60).stdout
            found["local_stores"] = len(re.findall(r"\bSTL(?:\.\w+)*\s", code))
            found["local_loads"] = len(re.findall(r"\bLDL(?:\.\w+)*\s", code))
    return found


def kernel_resources(compiled) -> KernelResources:
    """Resources of a Triton ``CompiledKernel`` (what ``kernel[grid](...)`` returns, or one from
    ``captured_launches`` or ``triton.compile``). Registers and spills: the driver's when the
    kernel is loaded or can be (a GPU of its architecture), else cuobjdump's reading of the cubin
    (spills = (stack frame + local) bytes / 4, the driver's local size in Triton's units)."""
    meta = compiled.metadata
    registers = spills = None
    source = "unknown"
    if getattr(compiled, "n_regs", None) is None and _loadable(compiled):
        with contextlib.suppress(Exception):
            compiled._init_handles()      # loads the module: the driver then reports n_regs, n_spills
    if getattr(compiled, "n_regs", None) is not None:
        registers, spills, source = int(compiled.n_regs), int(compiled.n_spills), "driver"
    else:
        found = cubin_resources(compiled.kernel, meta.name, sass=False)
        if found is not None:
            registers, spills = found["registers"], (found["stack"] + found["local"]) // 4
            source = "cuobjdump"
    return KernelResources(meta.name, _arch(compiled), int(meta.num_warps), int(meta.num_stages),
                           registers, spills, int(meta.shared), source)


def _loadable(compiled) -> bool:
    """Whether this process can load ``compiled`` on its GPU (a real one of the same architecture)."""
    try:
        import torch
        if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            return False
        major, minor = torch.cuda.get_device_capability()
        return _arch(compiled).rstrip("a") == f"sm{major}{minor}"
    except Exception:
        return False


# ---------------------------------------------------------------------------------------------
# compiled kernels of real launches (GPU), or compiled for a named GPU (anywhere)

class Launch(NamedTuple):
    """One compiled kernel launched inside ``captured_launches``."""
    kernel: str              # the @triton.jit function's name
    compiled: object         # Triton's CompiledKernel
    grid: tuple | None       # programs along each axis, when it could be worked out
    config: dict             # the BLOCK_* constexprs, num_warps and num_stages it was launched with
    calls: int               # launches of this compiled kernel inside the block


@contextlib.contextmanager
def jit_run_replaced(run):
    """Triton's ``JITFunction.run`` replaced by ``run(original, kernel, *args, grid, warmup,
    **kwargs)`` inside the block: the one way to see the launches of any Triton kernel, a learner's
    own ``kernel[grid](...)`` included, which flashlib's ``launch_hook`` option (its own launches
    only) cannot reach. flashlib's direct launches are off inside the block (``fast_launch``), so
    its kernels take that path too."""
    from triton.runtime.jit import JITFunction

    from .. import runtime
    original = JITFunction.run

    def replaced(self, *args, grid, warmup, **kwargs):
        return run(original, self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = replaced
    try:
        with runtime.kernel_options(fast_launch=False):
            yield
    finally:
        JITFunction.run = original


@contextlib.contextmanager
def captured_launches():
    """Record the compiled kernel of every Triton launch made inside the block (on a GPU)::

        with profile.captured_launches() as launches:
            flashlib.flash_attention(q, k, v)
        for launch in launches:
            print(launch.kernel, profile.kernel_resources(launch.compiled))

    flashlib's direct launches (``kernels/launch.py``, which skip Triton's launch path after a
    kernel's first call) are turned off inside the block, so every launch is seen; autotuning
    runs as usual (launch once before the block so the tuning's own launches are not counted).
    Yields a list of ``Launch``, one per distinct compiled kernel, filled as the block runs."""
    launches, index = [], {}

    def run(original, self, *args, grid, warmup, **kwargs):
        compiled = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if warmup or compiled is None:
            return compiled
        key = id(compiled)
        if key in index:
            launches[index[key]] = launches[index[key]]._replace(calls=launches[index[key]].calls + 1)
        else:
            named = {**dict(zip(self.arg_names, args)), **kwargs}
            config = {k: v for k, v in named.items() if k.startswith("BLOCK") and isinstance(v, int)}
            config.update(num_warps=compiled.metadata.num_warps, num_stages=compiled.metadata.num_stages)
            index[key] = len(launches)
            launches.append(Launch(self.__name__, compiled, _grid(grid, named), config, 1))
        return compiled

    with jit_run_replaced(run):
        yield launches


def _grid(grid, named):
    try:
        grid = grid(named) if callable(grid) else grid
        return tuple(int(g) for g in grid)
    except Exception:      # a grid function that needs more than the named arguments
        return None


def compile_launches(launch_code: str, gpu="h100") -> list:
    """Run ``launch_code`` (Python source) with Triton's launches recorded instead of run, then
    compile each recorded launch for ``gpu`` (a key of kernels.config.TARGETS). Needs real
    ``@triton.jit`` kernels: a process started with TRITON_INTERPRET=0 (``compile_in_child``
    starts one). Returns one dict per launch: kernel, config, resources, occupancy, seconds."""
    import triton

    from .. import runtime
    from ..kernels import config as kernel_config
    from ..kernels import targets
    if runtime.INTERPRET:
        raise RuntimeError("kernels defined under Triton's interpreter cannot be compiled: use "
                           "compile_in_child, which runs with TRITON_INTERPRET=0")
    target = kernel_config.TARGETS[gpu]

    recorded = []

    def record(kernel, grid, args, kwargs):   # flashlib's launches (its launch_hook option)
        recorded.append((kernel, args, kwargs))

    def record_direct(original, kernel, *args, grid, warmup, **kwargs):   # a kernel[grid](...) of its own
        record(kernel, grid, args, kwargs)

    # flashlib's launchers size their configs for the target (config.target()) and check nothing
    # about the device while a launch hook is set (their tensors are small CPU stand-ins)
    with (kernel_config.compiling_for(target), jit_run_replaced(record_direct),
          runtime.kernel_options(launch_hook=record, autotune=False)):
        exec(compile(launch_code, "<launch code>", "exec"), {"__name__": "__launch__"})
    rows = []
    for kernel, args, kwargs in recorded:
        start = time.perf_counter()
        compiled, constexprs, _ = targets.compile_launch(kernel, args, kwargs, target)
        seconds = time.perf_counter() - start
        resources = kernel_resources(compiled)
        occ = occupancy(resources.num_warps, resources.registers, resources.shared, gpu)
        rows.append(dict(kernel=kernel.__name__, gpu=gpu, triton=triton.__version__,
                         config={**{k: v for k, v in constexprs.items() if k.startswith("BLOCK")},
                                 "num_warps": resources.num_warps, "num_stages": resources.num_stages},
                         resources=resources._asdict(), occupancy=occ._asdict(),
                         limited_by=occ.limited_by, seconds=round(seconds, 2)))
    return rows


_MARK = "FLASHLIB-PROFILE-ROWS "


def compile_in_child(launch_code: str, gpu="h100", timeout=300) -> list:
    """``compile_launches(launch_code, gpu)`` in a child Python with Triton's interpreter off, so
    it works from a notebook on a CPU (whose kernels are the interpreter's). A few seconds: the
    child imports torch and flashlib, then compiles each kernel (about 1-3 s each). Example::

        rows = compile_in_child('''
        import torch
        from flashlib.kernels import primer
        primer.softmax(torch.randn(4, 1000, dtype=torch.float16))
        ''', gpu="h100")
    """
    import textwrap
    code = (f"import json\nfrom flashlib.teach import profile\n"
            f"rows = profile.compile_launches({textwrap.dedent(launch_code)!r}, {gpu!r})\n"
            f"print({_MARK!r} + json.dumps(rows))\n")
    env = {**os.environ, "TRITON_INTERPRET": "0", "FLASHLIB_FAST_LAUNCH": "0"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=timeout)
    line = next((line for line in run.stdout.splitlines() if line.startswith(_MARK)), None)
    if run.returncode != 0 or line is None:
        raise RuntimeError(f"compiling for {gpu} failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return json.loads(line[len(_MARK):])


# ---------------------------------------------------------------------------------------------
# torch.profiler traces as a small table

def _device_kind(event) -> str:
    kind = getattr(event, "device_type", None)
    return str(kind).rsplit(".", 1)[-1] if kind is not None else "CPU"


def kernel_table(prof, top=12) -> list:
    """Rows {name, where, calls, total_us, mean_us, share} from a ``torch.profiler.profile`` (or
    its ``key_averages()``), the most time first, at most ``top``. The GPU's kernels (their time
    on the device) when the trace has any; else the CPU's operators (their self time, which
    excludes the operators they call). share: of the total over all such rows, not just the top."""
    events = list(prof.key_averages() if hasattr(prof, "key_averages") else prof)
    device = [e for e in events if _device_kind(e) not in ("CPU", "")]
    rows = []
    for e in device or events:
        if device:
            total = getattr(e, "self_device_time_total", None)
            if total is None:
                total = getattr(e, "self_cuda_time_total", 0)
        else:
            total = e.self_cpu_time_total
        rows.append(dict(name=e.key, where=_device_kind(e) if device else "CPU", calls=int(e.count),
                         total_us=float(total), mean_us=float(total) / max(int(e.count), 1)))
    grand = sum(r["total_us"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["total_us"] / grand
    return sorted(rows, key=lambda r: -r["total_us"])[:top]


def format_table(rows, width=60) -> str:
    """``kernel_table``'s rows as text, kernel names cut to ``width`` characters."""
    if not rows:
        return "(no events)"
    where = rows[0]["where"]
    lines = [f"{'kernel' if where != 'CPU' else 'operator':<{width}} {'calls':>6} {where + ' total':>13} "
             f"{'mean':>10} {'share':>6}"]
    for r in rows:
        name = r["name"] if len(r["name"]) <= width else r["name"][:width - 3] + "..."
        lines.append(f"{name:<{width}} {r['calls']:>6} {r['total_us'] / 1e3:>10.3f} ms "
                     f"{r['mean_us']:>7.1f} us {r['share']:>6.1%}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the committed GPU report

REPORT_PLACES = ("benchmarks/results/h100/profile/report.json", "benchmarks/results/h200/profile/report.json")


def _root(root):
    if root is not None:
        return Path(root)
    from ..course.files import find_root
    return find_root() or Path.cwd()


def load_report(root=None):
    """(path, report) of the first committed report in REPORT_PLACES under the course's ``root``,
    or (None, None) while none is committed."""
    base = _root(root)
    for place in REPORT_PLACES:
        path = base / place
        if path.is_file():
            return path, json.loads(path.read_text())
    return None, None


def missing_report_message() -> str:
    """What a lesson prints while no GPU report is committed."""
    return ("no GPU profile is committed yet (looked for " + " and ".join(REPORT_PLACES) + "): "
            "it is written on a GPU by `python tools/profile_kernels.py "
            "benchmarks/results/<gpu>/profile`; until then this cell shows nothing measured")
