#!/usr/bin/env python
"""Generate exercises/exNN_*.py (the learners' stubs) from solutions/exNN_*.py.

Every block between a ``# BEGIN SOLUTION`` line and its ``# END SOLUTION`` line (markers
included) becomes one ``raise NotImplementedError("...")`` at the BEGIN marker's indentation;
everything else (docstrings, imports, set-up code around the answer) is kept as written.
Text after ``# BEGIN SOLUTION`` on the marker line, if any, becomes the error's message.

    python tools/make_exercises.py           write exercises/ from solutions/
    python tools/make_exercises.py --check   exit 1 if exercises/ is out of date (CI)

Only exNN_*.py files are touched; exercises/README.md is written by hand.
"""
import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION\b(?P<message>.*)$")
END = re.compile(r"^[ \t]*# END SOLUTION\b")


class MarkerError(ValueError):
    pass


def make_stub(source: str, name: str) -> str:
    """The exercise text for one solution file's text; ``name`` is e.g. "ex01_safe_softmax"."""
    out, inside, blocks = [], None, 0
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        begin, end = BEGIN.match(line.rstrip("\r\n")), END.match(line)
        if begin:
            if inside is not None:
                raise MarkerError(f"{name}.py:{number}: BEGIN SOLUTION inside the block opened "
                                  f"at line {inside}")
            inside, blocks = number, blocks + 1
            short = name.split("_")[0]
            message = begin["message"].strip().strip("\"'") or (
                f"{short}: your code goes here, then run `flashlib check {short}`")
            out.append(f"{begin['indent']}raise NotImplementedError({message!r})\n")
        elif end:
            if inside is None:
                raise MarkerError(f"{name}.py:{number}: END SOLUTION without BEGIN SOLUTION")
            inside = None
        elif inside is None:
            out.append(line)
    if inside is not None:
        raise MarkerError(f"{name}.py:{inside}: BEGIN SOLUTION is never closed")
    if blocks == 0:
        raise MarkerError(f"{name}.py has no # BEGIN SOLUTION / # END SOLUTION block")
    stub = "".join(out)
    compile(stub, f"exercises/{name}.py", "exec")  # a stub must at least parse
    return stub


def expected_files(root: Path = ROOT) -> dict:
    """{exercises/exNN_*.py path: its text} for every solutions/exNN_*.py."""
    return {root / "exercises" / src.name: make_stub(src.read_text(encoding="utf-8"), src.stem)
            for src in sorted((root / "solutions").glob("ex[0-9]*_*.py"))}


def main(argv=None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 if exercises/ is out of date")
    args = parser.parse_args(argv)
    try:
        wanted = expected_files(root)
    except MarkerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    stale = [p for p, text in wanted.items()
             if not p.is_file() or p.read_text(encoding="utf-8") != text]
    orphans = [p for p in sorted((root / "exercises").glob("ex[0-9]*_*.py")) if p not in wanted]
    for p in orphans:
        print(f"warning: {p.relative_to(root)} has no solutions/{p.name}", file=sys.stderr)
    if args.check:
        for p in stale:
            print(f"out of date: {p.relative_to(root)} (run python tools/make_exercises.py)",
                  file=sys.stderr)
        return 1 if stale or orphans else 0
    (root / "exercises").mkdir(exist_ok=True)
    for p in stale:
        p.write_text(wanted[p], encoding="utf-8")
        print(f"wrote {p.relative_to(root)}")
    print(f"{len(wanted)} exercises, {len(stale)} updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
