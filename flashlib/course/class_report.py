"""The results of ``flashlib grade`` as a printed table and a CSV, safe to open and to print.

``format_table``: students down, exercises across, "passed/total" or a one-word status per cell;
every cell is printed with its non-printable characters shown as escapes, so a name holding a
newline cannot fake a row nor an escape sequence steer the terminal. ``write_csv``: one row per
(student, exercise), its cells escaped the same way; a cell that a spreadsheet would run as a
formula (starting with =, +, - or @) is written with a leading apostrophe; its ``confinement`` column says on every row how the file ran (``UNCONFINED``
when grading was asked to run without a sandbox). ``summary``: how long grading took and how the
files were confined.
"""
import csv

from .files import short

FIELDS = ["student", "exercise", "passed", "total", "status", "confinement"]
UNCONFINED = "none: ran with the grader's rights (--unconfined)"


def write_csv(rows, path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: _csv_cell(v) for k, v in row.items()} for row in rows)


def _csv_cell(value):
    """A cell safe to open and to print: every non-printable character (ESC, a newline, a
    tab, ...) written as its escape (``_shown``), so that ``cat grades.csv`` cannot be steered
    by terminal sequences; one starting with =, +, - or @ (a formula to Excel or LibreOffice)
    gets a leading apostrophe."""
    if not isinstance(value, str):
        return value
    value = _shown(value)
    return "'" + value if value.startswith(("=", "+", "-", "@")) else value


def _shown(name: str) -> str:
    """A name as printed in the table: control characters shown as escapes, not obeyed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def summary(rows, seconds, jobs, timeout, mode, why, n_students):
    graded = [r for r in rows if r["status"] != "missing"]
    slow = max(graded, key=lambda r: r["seconds"], default=None)
    slowest = (f"; slowest: {_shown(slow['student'])} {short(slow['exercise'])} "
               f"({slow['seconds']:.1f} s)" if slow else "")
    confined = ("bubblewrap: a fresh read-only view, every namespace unshared, no network, no "
                "capabilities, a seccomp filter" if mode == "bubblewrap" else f"none ({why}): files ran with your rights")
    return (f"graded {n_students} students, {len(graded)} files, in {seconds:.0f} s with {jobs} "
            f"workers ({seconds / max(n_students, 1):.1f} s per student){slowest}; limit "
            f"{timeout:g} s per file\nconfinement: {confined}")


def _short_status(status: str) -> str:
    return status.split(":")[0].split(" (")[0]


def format_table(rows, students, names, *, seed=None, out=None) -> str:
    """Students down, exercises across: "3/5" per cell, or a one-word status."""
    cells = {(r["student"], r["exercise"]): r for r in rows}
    header = ["student", *(short(n) for n in names), "total"]
    body = []
    for s in students:
        unconfined = any(cells[s, n].get("confinement") == UNCONFINED for n in names)
        line, got, total = [_shown(s) + (" (UNCONFINED)" if unconfined else "")], 0, 0
        for n in names:
            r = cells[s, n]
            got, total = got + r["passed"], total + r["total"]
            word = _short_status(r["status"])
            line.append(f"{r['passed']}/{r['total']}" if word in ("passed", "failed")
                        else _shown(word))
        line.append(f"{got}/{total}")
        body.append(line)
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
    text = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [header, *body]]
    foot = []
    if seed is not None:
        foot.append(f"seed {seed}")
    if out is not None:
        foot.append(f"details (status per exercise) in {out}")
    return "\n".join(text + ([", ".join(foot)] if foot else []))
