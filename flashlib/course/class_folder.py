"""The class folder of ``flashlib grade``, read once before grading and checked after.

``student_files``: a student's .py files (regular files, no links followed; bounded in size and
number) sent to the student's process; ``read_tree``: a fingerprint of every file of the class
folder (sha256 read in chunks, bounded in total) and a copy of the small ones; ``restore``:
after grading, what changed, put back from that copy where it was kept.

Limits: past HASHED_ALL bytes a file is known by its size and mtime only; files bigger than KEPT
(or past KEPT_ALL in all) are fingerprinted, not restorable.
"""
import hashlib
import os
from pathlib import Path

MAX_FILE = 1 << 20                                   # bytes: a bigger .py file is not graded
KEPT = 16 << 20                                      # bytes: bigger files are hashed, not kept
KEPT_ALL = 256 << 20                                 # bytes kept of the whole class folder
HASHED_ALL = 4 << 30                                 # bytes hashed (past it: size and mtime)
MAX_FILES = 20_000                                   # files a class folder may hold
STUDENT_BYTES = 4 << 20                              # bytes of a student's .py files sent along


def read_tree(folder):
    """{relative path: (fingerprint, bytes or None)} of every file under ``folder`` (links not
    followed): the sha256 of its bytes, read in 1 MB chunks (past HASHED_ALL bytes in all: its
    size and mtime), and the bytes themselves if at most KEPT (until KEPT_ALL in all). A folder
    of more than MAX_FILES files is refused (ValueError)."""
    files, hashed, kept = {}, 0, 0
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        if len(files) >= MAX_FILES:
            raise ValueError(f"{folder} holds more than {MAX_FILES} files: grade a folder of "
                             "students' exercise folders")
        st = path.stat()
        keep = st.st_size <= KEPT and kept + st.st_size <= KEPT_ALL
        if hashed + st.st_size > HASHED_ALL:
            fingerprint, data = f"size {st.st_size}, mtime {st.st_mtime_ns}", None
        else:
            digest, chunks = hashlib.sha256(), []
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
                    if keep:
                        chunks.append(chunk)
            fingerprint, data = digest.hexdigest(), b"".join(chunks) if keep else None
            hashed += st.st_size
        kept += len(data) if data is not None else 0
        files[str(path.relative_to(folder))] = (fingerprint, data)
    return files


def restore(folder, before):
    """Compare the class folder with ``before``; put back what changed; return a report."""
    try:
        after = read_tree(folder)
    except ValueError as e:
        return f"WARNING: the class folder changed while grading: {e}"
    changed = [p for p in before if after.get(p, (None,))[0] != before[p][0]]
    added = [p for p in after if p not in before]
    for rel in changed:
        if before[rel][1] is not None:
            Path(folder, rel).parent.mkdir(parents=True, exist_ok=True)
            Path(folder, rel).write_bytes(before[rel][1])
    if not changed and not added:
        return f"class folder unchanged ({len(before)} files, sha256 before and after)"
    return (f"WARNING: the class folder changed while grading: {len(changed)} files changed or "
            f"deleted (restored from the copy taken before grading: {', '.join(changed[:5])}), "
            f"{len(added)} added ({', '.join(added[:5])}); grades used the copy")


def student_files(folder):
    """{relative path: bytes} of the .py files in ``folder``: regular files only, found without
    following a link (a linked file or folder, e.g. to another student's, is not graded), at
    most MAX_FILE bytes each and STUDENT_BYTES in all (the exercise files, exNN_*.py at the
    top, first)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted(filenames):
            p = Path(dirpath, name)
            if (p.suffix == ".py" and not p.is_symlink() and p.is_file()
                    and p.stat().st_size <= MAX_FILE):
                found.append(p)
    found.sort(key=lambda p: (p.parent != Path(folder) or not p.name.startswith("ex"), str(p)))
    files, total = {}, 0
    for p in found:
        size = p.stat().st_size
        if total + size <= STUDENT_BYTES:
            files[str(p.relative_to(folder))] = p.read_bytes()
            total += size
    return dict(sorted(files.items()))
