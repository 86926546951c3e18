"""Strip or check the lesson notebooks: no outputs, no execution counts, clean metadata.

    python tools/clean_notebooks.py            clean every lessons/*.ipynb in place
    python tools/clean_notebooks.py --check    only report; exit 1 if any notebook is not clean
    python tools/clean_notebooks.py FILE ...   the same, for the given notebooks

Clean means: code cells with no outputs and ``execution_count``
null; cell metadata empty except nbval's ``tags``; notebook metadata exactly the kernelspec
{"name": "python3", "display_name": "Python 3", "language": "python"} and language_info
{"name": "python"} (no widget state, no kernel versions); and the file written the way nbformat
writes it, so that a clean notebook's bytes do not change on a second clean. Cell ids are kept.
tests/test_notebooks.py imports ``problems`` and ``canonical_text`` from here.
"""
import argparse
import copy
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
LANGUAGE_INFO = {"name": "python"}
CELL_METADATA_KEPT = ("tags",)  # nbval reads tags such as "nbval-skip" and "raises-exception"


def clean(nb):
    """A copy of ``nb`` without outputs, execution counts or extra metadata."""
    nb = copy.deepcopy(nb)
    nb.metadata = nbformat.from_dict({"kernelspec": dict(KERNELSPEC),
                                      "language_info": dict(LANGUAGE_INFO)})
    for cell in nb.cells:
        cell.metadata = nbformat.from_dict({key: cell.metadata[key] for key in CELL_METADATA_KEPT
                                            if key in cell.metadata})
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def canonical_text(nb) -> str:
    """The file text nbformat.write would produce for ``nb``."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def problems(nb) -> list[str]:
    """What is not clean about ``nb``, in words (empty when clean)."""
    found = []
    extra = sorted(set(nb.metadata) - {"kernelspec", "language_info"})
    if extra:
        found.append(f"notebook metadata has extra keys {extra} (widget state, kernel versions?)")
    if nb.metadata.get("kernelspec") != KERNELSPEC:
        found.append(f"kernelspec is {nb.metadata.get('kernelspec')}, expected {KERNELSPEC}")
    if nb.metadata.get("language_info") != LANGUAGE_INFO:
        found.append(f"language_info is {nb.metadata.get('language_info')}, expected {LANGUAGE_INFO}")
    for index, cell in enumerate(nb.cells):
        extra = sorted(set(cell.metadata) - set(CELL_METADATA_KEPT))
        if extra:
            found.append(f"cell {index}: metadata keys {extra}")
        if cell.cell_type == "code":
            if cell.get("outputs"):
                found.append(f"cell {index}: {len(cell.outputs)} output(s)")
            if cell.get("execution_count") is not None:
                found.append(f"cell {index}: execution_count {cell.execution_count}")
    return found


def check_file(path: Path) -> list[str]:
    """Problems of the notebook at ``path``, including a file not written as nbformat writes it."""
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    found = problems(nb)
    if not found and text != canonical_text(nb):
        found.append("not formatted as nbformat writes it (run tools/clean_notebooks.py)")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path,
                        help="notebooks (default: every lessons/*.ipynb)")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if any notebook is not clean")
    args = parser.parse_args(argv)
    paths = args.paths or sorted((ROOT / "lessons").glob("*.ipynb"))
    dirty = 0
    for path in paths:
        found = check_file(path)
        if not found:
            continue
        dirty += 1
        if args.check:
            print(f"{path}: not clean")
            for problem in found:
                print(f"    {problem}")
        else:
            nb = clean(nbformat.read(path, as_version=4))
            nbformat.validate(nb)
            path.write_text(canonical_text(nb), encoding="utf-8")
            print(f"{path}: cleaned ({len(found)} problem(s))")
    if args.check and dirty:
        print(f"{dirty} of {len(paths)} notebook(s) not clean: run python tools/clean_notebooks.py")
        return 1
    if not dirty:
        print(f"{len(paths)} notebook(s) clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
