"""Run lessons' code cells in order on a machine without Jupyter (a rented GPU box), the way a
kernel would: one namespace per notebook, cells top to bottom, matplotlib off-screen.

    PYTHONPATH=$PWD python tools/run_lesson_cells.py lessons/07_flashattention2.ipynb ... [--out DIR]
        [--cells 1,19,24]   (only these cell indices, e.g. setup, a check and what uses it)

Writes DIR/<notebook>.log (every cell's time, printed output and error, flushed per cell) and
prints a line per slow (> 5 s) or failing cell and a summary per notebook; an error does not stop
the notebook, as nbval's lax mode does not. Exits 1 if any cell failed. Cell sources are
registered with linecache, so @triton.jit can read a kernel's source as it does from a file.
"""
import argparse
import builtins
import contextlib
import io
import json
import linecache
import sys
import time
import traceback
from pathlib import Path

import matplotlib

matplotlib.use("Agg")


def run_notebook(path: Path, out: Path, only=None) -> tuple[float, int]:
    """Run one notebook's code cells; return (seconds, failing cells)."""
    import matplotlib.pyplot as plt

    namespace = {"__name__": "__main__"}
    start, errors = time.perf_counter(), 0
    with open(out / f"{path.name}.log", "w") as log:
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "code" or (only is not None and i not in only):
                continue
            source = "".join(cell["source"])
            filename = f"<{path.name} cell {i}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            printed, error, t = io.StringIO(), None, time.perf_counter()
            try:
                with contextlib.redirect_stdout(printed):
                    exec(compile(source, filename, "exec"), namespace)
                    plt.close("all")
            except Exception:
                error = traceback.format_exc(limit=4)
            seconds = time.perf_counter() - t
            errors += error is not None
            log.write(f"=== cell {i} ({cell.get('id')}) {seconds:.2f} s{' ERROR' if error else ''}\n"
                      f"{printed.getvalue()}{error or ''}\n")
            log.flush()
            if error or seconds > 5:
                last = error.strip().splitlines()[-1] if error else ""
                print(f"{path}[{i}] {seconds:.1f} s {last}", flush=True)
    return time.perf_counter() - start, errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the logs")
    parser.add_argument("--cells", type=lambda s: {int(i) for i in s.split(",")},
                        help="comma-separated cell indices to run (default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    builtins.display = lambda *objects, **_: print(*(type(o).__name__ for o in objects))
    summary = [(nb, *run_notebook(nb, args.out, args.cells)) for nb in args.notebooks]
    for nb, seconds, errors in summary:
        print(f"{str(nb):45s} {seconds:7.1f} s  failing cells {errors}")
    return 1 if any(errors for _, _, errors in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
