"""`flashlib grade` against a hostile class: forged output, patched libraries, vandalism, exits,
a hang, a memory hog, 10 MB of output, borrowed answers, shared memory and forked children past
the memory limit, a fork bomb, a reply that makes the grader slow, host-level harm, copying
another student; issue 55's: the instructor's own files and agent socket (spy), a reply of many
views of one small tensor, SysV shared memory, flashlib's source re-executed and copies of the
course found through mountinfo (reloader), terminal escapes (tests/hostile/, one folder per
attack). Run as root and as an ordinary user (the sandbox makes both nobody's view).

The class also has two honest students (the reference answers; a known wrong answer), whose rows
must be exactly what in-process grading (`grading.run_checks`) gives with the same seed, and the
class folder and the course's folders must be byte for byte unchanged afterwards. Graded on the
NumPy exercises ex00-ex04 with a 10 s limit and 1 GB on 2 workers: 52 s before issue 36's last
attacks were added, 73 s after (2 cores shared with other jobs; the staller takes the limit plus
the grader's GRACE, the hanger the limit). Then the Triton route (ex05, ex07: launches with a student's kernel run in the student's
process) against in-process grading, and the command run from another folder (issue 10). Last,
the answers withheld from ex05b, ex06, ex07b, ex09, ex10 and ex13: borrowed by name, by
flashlib's source executed afresh or by its text, and torch behind a kernel's launch.
"""
import ast
import csv
import hashlib
import io
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import flashlib
from flashlib import course
from flashlib.course import checks, class_report, classroom, grading, processes, sandbox

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "tests" / "hostile"
NUMPY_EXERCISES = ["ex00", "ex01", "ex02", "ex03", "ex04"]
TIMEOUT = 10
MEMORY = 1          # GB (--memory 1, as in issue 36)
VANDAL_TRACES = [ROOT / "vandal_was_here.txt", Path("/tmp/flashlib_vandal_was_here.txt")]

# (student, exercise): (a regular expression the row's status matches, points; None: all)
EXPECTED = {
    ("forger", "ex01"): (r"failed$", 0),
    ("garbler", "ex01"): (r"crashed \(garbled reply", 0),
    ("patcher", "ex01"): (r"not accepted: changes numpy\.", 0),
    ("sneaky_patcher", "ex01"): (r"failed$", 0),          # the patch misses the grader's process
    ("vandal", "ex01"): (r"not accepted: tried to write ", 0),
    ("exiter", "ex00"): (r"crashed \(exit code 0\)", 0),
    ("exiter", "ex01"): (r"crashed \(exit code 7\)", 0),
    ("exiter", "ex02"): (r"crashed \(.*KeyboardInterrupt$", 0),  # 130, or SIGINT outside a
    ("exiter", "ex03"): (r"passed$", None),               # PID namespace; the next one passes
    ("hanger", "ex01"): (rf"timeout \(over {TIMEOUT} s\)$", 0),
    ("hog", "ex01"): (r"error: your file fails on import: MemoryError", 0),
    ("printer", "ex01"): (r"passed$", None),
    ("resolver", "ex01"): (r"error: RuntimeError: flashlib\.teach\.softmax\.safe_softmax is "
                           r"flashlib's own answer .* removed from the copy", 0),
    ("reloader", "ex01"): (r"error: RuntimeError: nothing to borrow \(flashlib's source: "
                           r"flashlib\.teach\.softmax\.safe_softmax is flashlib's own answer", 0),
    ("multi_expander", "ex01"): (r"crashed \(a reply the grader cannot read .*too large once "
                                 r"rebuilt", 0),
    ("escaper", "ex01"): (r"error: RuntimeError: \x1b\[2J\x1b\[H\x1b\[32mada", 0),
    ("cheater", "ex01"): (r"not accepted: write it yourself \(uses "
                          r"flashlib\.teach\.softmax\.safe_softmax\)$", 0),
    # flagged when its import of solutions/ reaches the hidden folder; graded as root without
    # user switch (nobody cannot read a course under a 0700 folder, e.g. a mktemp clone) the
    # import fails first and the stub is all it has: 0 points either way
    ("solution_reader", "ex02"): (r"(not accepted: write it yourself \(reads solutions|not done)", 0),
    ("broken", "ex01"): (r"error: your file does not parse: SyntaxError: .* \(line 3\)$", 0),
    ("absent", "ex00"): (r"passed$", None),
    ("bomber", "ex01"): (r"crashed \(a reply the grader cannot read .*items once expanded", 0),
    ("expander", "ex01"): (r"crashed \(a reply the grader cannot read .*too large once rebuilt", 0),
    ("mapper", "ex01"): (r"crashed \(over the memory limit: ", 0),
    ("forker", "ex01"): (r"crashed \(over the memory limit: ", 0),
    ("staller", "ex01"): (rf"timeout \(over {TIMEOUT} s, the grader's checks of its replies", 0),
    ("forkbomb", "ex01"): (r"error: RuntimeError: forked \d+ processes", 0),
}
# what confinement adds (unconfined, these get through, as documented)
CONFINED = {
    ("host_harm", "ex01"): ((r"error: RuntimeError: got nothing; blocked: core_pattern .*, "
                             r"mknod .*, pty "), 0),
    ("peeker", "ex01"): (r"error: RuntimeError: nothing to copy", 0),
    ("spy", "ex01"): (r"error: RuntimeError: uid 65534; got nothing; blocked: secret No such file "
                      r"or directory, home No such file or directory, socket Permission denied, "
                      r"setuid (Operation not permitted|Invalid argument)", 0),
    ("shm_hoarder", "ex01"): (r"error: RuntimeError: shmget refused \(errno 1\)", 0),
}


def _hashes(*paths):
    files = [p for path in paths for p in ([path] if path.is_file() else sorted(path.rglob("*")))]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def _fill(file, **values):
    text = file.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", str(value))
    file.write_text(text)


def _hostile_class(folder, pty="/nonexistent", token="0", secret="/nonexistent",
                   socket_path="/nonexistent"):
    """tests/hostile/* plus the honest: ada (reference answers), mia (ex01 with a known bug)."""
    shutil.copytree(HOSTILE, folder, ignore=shutil.ignore_patterns("conftest.py", "__pycache__"))
    _fill(folder / "spy" / "ex01_safe_softmax.py", SECRET=secret, SOCKET=socket_path)
    for student in ("vandal", "peeker"):
        _fill(folder / student / "ex01_safe_softmax.py", CLASS=folder)
    _fill(folder / "host_harm" / "ex01_safe_softmax.py", PTY=pty)
    _fill(folder / "forkbomb" / "ex01_safe_softmax.py", TOKEN=token)
    shutil.copy(ROOT / "solutions" / "ex03_online_attention.py", folder / "exiter")
    (folder / "ada").mkdir()
    for name in course.list_exercises(ROOT)[:5]:
        shutil.copy(ROOT / "solutions" / f"{name}.py", folder / "ada")
    (folder / "mia").mkdir()
    shutil.copy(ROOT / "tests" / "mutants" / "ex01_no_max_subtraction.py",
                folder / "mia" / "ex01_safe_softmax.py")
    shutil.copy(ROOT / "solutions" / "ex00_roofline.py", folder / "mia")


def _in_process(file, name, seed):
    """(status, passed) of ``file`` graded in this process over the checks ``grade`` runs (memory
    checks measure this process, so ``grade`` leaves them out: checks.not_under_grade)."""
    report = grading.run_checks(name, path=file, seed=seed, root=ROOT)
    skipped = [c for c in course.load_grader(name, ROOT).CHECKS
               if c not in checks.under_grade([c])]
    titles = {grading.check_title(c) for c in skipped}
    passed = sum(r.status == "ok" for r in report.results if r.title not in titles)
    return report.status, passed


def _leftovers(token):
    """Processes still running whose command line holds ``token`` (the fork bomb's sleeps)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_hostile_class(tmp_path, grader_seed, capsys):
    import socket

    cls = tmp_path / "class"
    master, terminal = os.openpty()          # stands for the instructor's terminal
    token = str(time.time_ns())
    home = tmp_path / "home"                 # the instructor's: a key only they may read, an
    home.mkdir(mode=0o700)                   # agent's socket only they may use
    (home / "id_ed25519").write_text("PRIVATE KEY of the instructor\n")
    (home / "id_ed25519").chmod(0o600)
    agent = socket.socket(socket.AF_UNIX)
    agent.bind(str(home / "agent.sock"))
    agent.listen()
    agent.setblocking(False)
    _hostile_class(cls, pty=os.ttyname(terminal), token=token, secret=home / "id_ed25519",
                   socket_path=home / "agent.sock")
    for trace in VANDAL_TRACES:
        trace.unlink(missing_ok=True)
    graded = course.list_exercises(ROOT)[:5]    # (other files may be edited meanwhile)
    course_files = [ROOT / "solutions" / f"{n}.py" for n in graded] + \
        [ROOT / "tests" / "exercises" / f"test_{n}.py" for n in graded] + \
        [ROOT / "flashlib" / "testing.py"]
    before, course_before = _hashes(cls), _hashes(*course_files)
    mode = sandbox.probe()[0]

    try:
        rows = classroom.grade(cls, out=tmp_path / "grades.csv", timeout=TIMEOUT, jobs=2,
                               exercises=NUMPY_EXERCISES, seed=grader_seed, progress=False,
                               memory=MEMORY, unconfined=True)   # checks below adapt to the mode
        os.set_blocking(master, False)
        try:
            on_terminal = os.read(master, 4096)
        except BlockingIOError:
            on_terminal = b""
        try:
            agent.accept()
            reached = True
        except BlockingIOError:
            reached = False
    finally:
        os.close(master)
        os.close(terminal)
        agent.close()
    printed = capsys.readouterr().out
    got = {(r["student"], r["exercise"][:4]): r for r in rows}
    names = {course.short(n): n for n in course.list_exercises(ROOT)}

    expected = {**EXPECTED, **(CONFINED if mode == "bubblewrap" else {})}
    for key, (status, points) in expected.items():
        row = got[key]
        assert re.match(status, row["status"]), (key, row)
        assert row["passed"] == (row["total"] if points is None else points), (key, row)
    for (student, ex), row in got.items():
        assert 0 <= row["passed"] <= row["total"], row
        if student not in ("ada", "mia") and (student, ex) not in {**EXPECTED, **CONFINED}:
            assert row["status"] == "missing", row
    for student in ("ada", "mia"):                   # the honest: as graded in-process
        for ex in NUMPY_EXERCISES:
            file = cls / student / f"{names[ex]}.py"
            if file.is_file():
                status, passed = _in_process(file, names[ex], grader_seed)
                assert (got[student, ex]["status"], got[student, ex]["passed"]) == \
                    (status, passed), (student, ex)
    assert got["mia", "ex01"]["status"] == "failed" and got["ada", "ex04"]["status"] == "passed"
    # the deadline held though the grader was busy with the staller's reply (GRACE to notice)
    assert got["staller", "ex01"]["seconds"] < TIMEOUT + processes.GRACE + 3
    forked = int(re.search(r"forked (\d+)", got["forkbomb", "ex01"]["status"]).group(1))
    assert not _leftovers(f"600.{token}"), "the fork bomb outlived grading"
    if mode == "bubblewrap":
        assert forked < sandbox.NPROC, forked
        assert on_terminal == b"", on_terminal
        assert not reached, "a student reached the instructor's agent socket"

    assert _hashes(cls) == before, "a submission changed the class folder"
    assert _hashes(*course_files) == course_before, "a submission changed the course"
    assert "class folder unchanged" in printed and "WARNING" not in printed
    assert not VANDAL_TRACES[0].exists(), "the vandal wrote into the course folder"
    if mode == "bubblewrap":                          # /tmp is writable without confinement
        assert not VANDAL_TRACES[1].exists()
    for trace in VANDAL_TRACES:
        trace.unlink(missing_ok=True)
    saved = (tmp_path / "grades.csv").read_text()
    assert ",99," not in saved and "graded 14 students" not in printed
    assert "\x1b" not in saved + printed and "\\x1b[2J" in saved       # shown, not obeyed
    attackers = {s for s, _ in expected} - {"exiter", "printer", "absent"}
    if mode == "bubblewrap":                          # unconfined, the spy reads what you can
        assert "PRIVATE KEY" not in saved + printed
    for (student, ex), row in got.items():           # printer, absent, exiter's ex03 are honest
        if student in attackers:
            assert row["passed"] == 0, row
    assert f"graded {len({r['student'] for r in rows})} students" in printed
    assert f"{MEMORY:g} GB of memory for its processes together" in printed
    assert "not prevented: " in printed


def test_no_confinement_is_refused_unless_asked_for(tmp_path, monkeypatch, capsys):
    """Issue 36: where bubblewrap is unavailable, `grade` refuses before any student file runs
    (a file would run with the instructor's rights); --unconfined grades anyway, and says so."""
    (tmp_path / "ada").mkdir()
    shutil.copy(ROOT / "solutions" / "ex00_roofline.py", tmp_path / "ada")
    monkeypatch.setattr(sandbox, "probe", lambda: ("none", "no bwrap here"))
    with pytest.raises(classroom.Unconfined, match=r"no confinement here \(no bwrap here.*--unconfined"):
        classroom.grade(tmp_path, out=tmp_path / "g.csv", exercises=["ex00"], progress=False)
    assert not (tmp_path / "g.csv").exists()
    rows = classroom.grade(tmp_path, out=tmp_path / "g.csv", exercises=["ex00"], progress=False,
                           unconfined=True, timeout=30)
    assert [r["status"] for r in rows] == ["passed"]
    printed = capsys.readouterr().out
    assert "no bwrap here" in printed and "ada (UNCONFINED)" in printed
    with open(tmp_path / "g.csv", newline="") as f:
        assert [r["confinement"] for r in csv.DictReader(f)] == [class_report.UNCONFINED]


def test_class_folder_is_restored_if_changed(tmp_path, capsys):
    (tmp_path / "ada").mkdir()
    (tmp_path / "ada" / "ex00_roofline.py").write_text("x = 1\n")
    before = classroom._read_tree(tmp_path)
    (tmp_path / "ada" / "ex00_roofline.py").write_text("vandalised\n")
    (tmp_path / "ada" / "new.txt").write_text("new\n")
    report = classroom._restore(tmp_path, before)
    assert "WARNING" in report and "ada/ex00_roofline.py" in report and "ada/new.txt" in report
    assert (tmp_path / "ada" / "ex00_roofline.py").read_text() == "x = 1\n"


def test_class_folder_is_read_in_bounded_memory(tmp_path, monkeypatch):
    """Issue 55: a big (sparse) file is hashed in chunks and not kept; a folder of too many files
    is refused; a student's .py files are sent up to a total, exercise files first."""
    import resource

    from flashlib.course import class_folder

    (tmp_path / "eve").mkdir()
    with open(tmp_path / "eve" / "big.bin", "wb") as f:
        f.truncate(256 << 20)                                 # 256 MiB, no disk
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tree = class_folder.read_tree(tmp_path)
    assert tree["eve/big.bin"][1] is None and len(tree["eve/big.bin"][0]) == 64
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10   # KiB
    monkeypatch.setattr(class_folder, "MAX_FILES", 3)
    for i in range(4):
        (tmp_path / "eve" / f"f{i}.py").write_text("x = 1\n" * 100)
    with pytest.raises(ValueError, match="more than 3 files"):
        class_folder.read_tree(tmp_path)
    (tmp_path / "eve" / "ex01_safe_softmax.py").write_text("y = 2\n")
    monkeypatch.setattr(class_folder, "STUDENT_BYTES", 1300)
    files = class_folder.student_files(tmp_path / "eve")
    assert "ex01_safe_softmax.py" in files and len(files) == 3   # 6 + 600 + 600 bytes


@pytest.mark.parametrize("source, why", [
    ("from flashlib.teach.softmax import safe_softmax\n", "uses flashlib.teach.softmax.safe_softmax"),
    ("import flashlib\nf = flashlib.teach.tiled.fa2_forward\n", "uses flashlib.teach.tiled.fa2_forward"),
    ("import flashlib\ng = getattr(flashlib, 'tiled')\n", "uses flashlib (as a value)"),
    ("import importlib\n", "imports importlib"),
    ("x = __import__('flashlib')\n", "uses __import__"),
    ("exec(open('a').read())\n", "uses exec"),
    ("import sys\nm = sys.modules\n", "uses sys.modules"),
    ("p = '../solutions/ex01_safe_softmax.py'\n", "names solutions/"),
])
def test_borrowed_code_is_named(source, why):
    stub = (ROOT / "exercises" / "ex07_fa2_inner_loop.py").read_text()   # imports flashlib
    assert classroom.borrowed(ast.parse(source), ast.parse(stub)) == why


def test_stubs_and_solutions_are_not_borrowed():
    for name in course.list_exercises(ROOT):
        stub = ast.parse((ROOT / "exercises" / f"{name}.py").read_text())
        for folder in ("exercises", "solutions"):
            tree = ast.parse((ROOT / folder / f"{name}.py").read_text())
            assert classroom.borrowed(tree, stub) is None, (folder, name)


def test_replies_cannot_name_code():
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    payload = pickle.dumps((pickle.dumps(Evil()), []))
    with pytest.raises(pickle.UnpicklingError, match="not accepted"):
        sandbox.decode(payload, restricted=True)


def test_arrays_and_tensor_views_cross_the_wire():
    """A view into a larger buffer travels with its whole storage; shared storage stays shared."""
    rng = np.random.default_rng(7)
    buffer = torch.from_numpy(rng.standard_normal((9, 97)).astype(np.float32))
    view, other = buffer[2:5, 3:20], buffer[6]                     # (3, 17), (97,)
    array = rng.standard_normal((17, 3))[::2]                      # non-contiguous
    frame, encoder = sandbox.encode({"a": array, "t": (view, other), "s": np.float32(2.5)})
    message, decoder = sandbox.decode(frame[4:], restricted=True)
    assert np.array_equal(message["a"], array) and message["s"] == np.float32(2.5)
    got_view, got_other = message["t"]
    assert torch.equal(got_view, view) and torch.equal(got_other, other)
    assert got_view.untyped_storage().data_ptr() == got_other.untyped_storage().data_ptr()
    assert got_view.stride() == view.stride() and len(decoder.new_storages) == 1


def test_only_flashlibs_own_functions_are_applied_beside_a_student():
    """checks.beside runs a function in the student process only if it is flashlib's own, named
    by its module (the student process resolves the name again and refuses other modules)."""
    from flashlib.teach import mbarrier

    sent = []
    box = type("Box", (), {"request": lambda self, msg, extra=None: sent.append(msg) or {"result": [("ok",)]}})()
    student = sandbox.Student(box, "ada/ex12c_tma_producer.py", "")
    assert student.apply(mbarrier.record, (1, 2), {}) == [("ok",)]
    assert sent[-1]["op"] == "apply" and sent[-1]["function"] == ("flashlib", "flashlib.teach.mbarrier", "record")
    for foreign in (len, os.path.join, lambda x: x):
        with pytest.raises(ValueError, match="only flashlib's own functions"):
            student.apply(foreign, (), {})
    assert len(sent) == 1


def test_replies_too_large_once_rebuilt_are_refused():
    """Few bytes on the wire, gigabytes in the grader: nested shared lists, and tensor views that
    show more elements than their storage holds. A small broadcast view still crosses."""
    bomb = [0]
    for _ in range(12):
        bomb = [bomb] * 10
    for reply, why in ((bomb, "items once expanded"),
                       (torch.zeros(1).expand(10_000, 10_000), "too large once rebuilt"),
                       (torch.zeros(40_000).as_strided((20_000, 20_000), (1, 1)),
                        "too large once rebuilt"),              # overlapping rows: 4e8 elements
                       ([torch.zeros(1).expand(2 ** 24)] * 8,   # each small enough, not together
                        "too large once rebuilt")):
        frame, _ = sandbox.encode(reply)
        assert len(frame) < 200_000
        with pytest.raises(pickle.UnpicklingError, match=why):
            sandbox.decode(frame[4:], restricted=True)
    small = torch.arange(3.0).expand(4, 3)
    got, _ = sandbox.decode(sandbox.encode(small)[0][4:], restricted=True)
    assert torch.equal(got, small)


@pytest.mark.skipif(torch.cuda.is_available(), reason="grade runs kernels through the "
                    "interpreter; in-process grading here would use the GPU")
def test_triton_launches_run_in_the_student_process(tmp_path, grader_seed):
    """ex05 (the student's launcher writes into views of NaN buffers) and ex07 (flashlib's FA2
    kernel and the grader's harness launched with the student's @triton.jit function): graded
    through the sandbox exactly as in-process."""
    names = {course.short(n): n for n in course.list_exercises(ROOT)}
    files = {"ada": {"ex05": ROOT / "solutions" / f"{names['ex05']}.py",
                     "ex07": ROOT / "solutions" / f"{names['ex07']}.py"},
             "eve": {"ex05": ROOT / "tests" / "mutants" / "ex05_store_no_mask.py",
                     "ex07": ROOT / "tests" / "mutants" / "ex07_no_rescale_l.py"},
             "inplace_forger": {"ex05": HOSTILE / "inplace_forger" / f"{names['ex05']}.py"},
             "one_liner": {"ex05": HOSTILE / "one_liner" / f"{names['ex05']}.py"}}
    for student, mine in files.items():
        (tmp_path / student).mkdir()
        for ex, file in mine.items():
            shutil.copy(file, tmp_path / student / f"{names[ex]}.py")
    rows = classroom.grade(tmp_path, out=None, timeout=120, jobs=2, exercises=["ex05", "ex07"],
                           seed=grader_seed, progress=False, unconfined=True)
    for row in rows:
        if row["exercise"][:4] not in files[row["student"]]:
            assert row["status"] == "missing"
            continue
        expected = _in_process(files[row["student"]][row["exercise"][:4]], row["exercise"],
                               grader_seed)
        assert (row["status"], row["passed"]) == expected, row
    assert {r["status"] for r in rows if r["student"] == "ada"} == {"passed"}
    got = {(r["student"], r["exercise"][:4]): r for r in rows}     # issue 55: forged, no kernel
    assert got["inplace_forger", "ex05"]["passed"] == got["one_liner", "ex05"]["passed"] == 0
    assert got["one_liner", "ex05"]["status"] == "not done"


def test_every_reference_answer_scores_full_marks_under_grade(tmp_path, grader_seed):
    """The solutions, graded as one student's folder, pass every exercise with every check that
    runs under grade: a grader that only works in-process (state the student's copy of an object
    keeps, as ex11's KVCache lengths did) shows here."""
    (tmp_path / "ada").mkdir()
    for name in course.list_exercises(ROOT):
        shutil.copy(ROOT / "solutions" / f"{name}.py", tmp_path / "ada" / f"{name}.py")
    rows = classroom.grade(tmp_path, out=None, timeout=120, jobs=2, seed=grader_seed, progress=False,
                           unconfined=True)
    assert len(rows) == len(course.list_exercises(ROOT))
    for row in rows:
        assert (row["status"], row["passed"]) == ("passed", row["total"]) and row["total"] > 0, row


def test_grade_from_another_folder_with_relative_paths(tmp_path):
    """Issue 10: `flashlib grade subs --out grades.csv` run outside the course folder."""
    shutil.copytree(ROOT / "solutions", tmp_path / "subs" / "ada",
                    ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "flashlib.course.cli", "grade", "subs", "--out",
                             "grades.csv", "--exercises", "ex00", "ex01", "--timeout", "30",
                             "--unconfined"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(io.StringIO(f.read())))
    assert [(r["student"], r["status"]) for r in rows] == [("ada", "passed")] * 2
    assert all(r["passed"] == r["total"] != "0" for r in rows)


def test_names_links_and_unsolved_copies(tmp_path, grader_seed, capsys):
    """Issue 36's table rows: a folder named like a spreadsheet formula, a name holding a newline
    and a fake result, a student folder that links to another's (and one whose exercises/ does),
    and an unsolved copy of exercises/ (0 points: the memory checks that cannot run under grade
    are left out, not counted as passed)."""
    names = [n for n in course.list_exercises(ROOT) if course.short(n) in ("ex01", "ex02", "ex03")]
    cls = tmp_path / "class"
    for student, source in (("alice", "solutions"), ("una", "exercises"),
                            ("=cmd|' -C calc'!A0", "solutions"), ("eve\npassed 82 of 82", "solutions")):
        (cls / student).mkdir(parents=True)
        for n in names:
            shutil.copy(ROOT / source / f"{n}.py", cls / student)
    (cls / "trudy").symlink_to(cls / "alice", target_is_directory=True)
    (cls / "mallory").mkdir()
    (cls / "mallory" / "exercises").symlink_to(cls / "alice", target_is_directory=True)
    rows = classroom.grade(cls, out=tmp_path / "grades.csv", timeout=TIMEOUT, jobs=2,
                           exercises=["ex01", "ex02", "ex03"], seed=grader_seed, progress=False,
                           unconfined=True)
    printed = capsys.readouterr().out
    got = {(r["student"], r["exercise"]): r for r in rows}
    for n in names:
        gradable = len(checks.under_grade(course.load_grader(n, ROOT).CHECKS))
        assert got["alice", n]["status"] == "passed" and got["alice", n]["passed"] == gradable
        assert got["alice", n]["total"] == gradable
        assert (got["una", n]["status"], got["una", n]["passed"]) == ("not done", 0)
        assert got["trudy", n]["status"].startswith("not accepted") and got["trudy", n]["passed"] == 0
        assert got["mallory", n]["status"] == "missing"
    assert any(len(course.load_grader(n, ROOT).CHECKS) > len(checks.under_grade(
        course.load_grader(n, ROOT).CHECKS)) for n in names), "no memory check was left out"
    saved = (tmp_path / "grades.csv").read_text()
    assert "\n'=cmd|" in saved and "\n=cmd" not in saved
    assert "eve\\npassed 82 of 82" in printed
    assert not any(line.startswith("passed 82 of 82") for line in printed.splitlines())



def test_confined_process_sees_a_fresh_view(tmp_path):
    """Issue 36's root-level attacks and issue 55's view: the student process sees /usr, Python,
    flashlib (the answers' copy), its scratch folder, a /dev of a few nodes and its own /proc;
    no /tmp, /run, /etc, /sys, home, course folders; /proc/sys and the rest read-only."""
    mode, why = sandbox.probe()
    if mode != "bubblewrap":
        pytest.skip(f"no bubblewrap sandbox on this machine: {why}")
    code = ("import os\n"
            "def observe():\n"
            "    seen = {'dev': sorted(os.listdir('/dev')), 'root': sorted(os.listdir('/')),\n"
            "            'uid': os.getuid(), 'course': os.path.exists(%r),\n"
            "            'tmp': os.listdir('/tmp') if os.path.isdir('/tmp') else []}\n"
            "    for path in ('/proc/sys/kernel/core_pattern', '/dev/null', '/dev/shm/probe',\n"
            "                 '/usr/flashlib_probe', 'mine.txt'):\n"
            "        try:\n"
            "            with open(path, 'a'):\n"
            "                seen[path] = 'writable'\n"
            "        except OSError as e:\n"
            "            seen[path] = e.strerror\n"
            "    return seen\n") % str(ROOT / "solutions")
    box = sandbox.Sandbox({"ex01_safe_softmax.py": code.encode()}, "ex01_safe_softmax.py",
                          run_dir=str(tmp_path), deadline=time.monotonic() + 60, confine=True,
                          hide=[], protect=[], memory=2 << 30, nproc=sandbox.NPROC)
    try:
        student = sandbox.Student(box, str(tmp_path / "ex01_safe_softmax.py"), code)
        assert student.load([])["status"] == "ok"
        seen = student.impl.observe()
    finally:
        box.close()
    assert seen["uid"] == 65534 and not seen["course"]
    assert set(seen["dev"]) == {"fd", "full", "null", "random", "shm", "stderr", "stdin",
                                "stdout", "urandom", "zero"}
    assert not set(seen["root"]) & {"run", "etc", "sys", "home", "var"}, seen["root"]
    # /tmp is an empty mount point, but for the folders the view binds under it when the Python
    # runtime or this clone lives there (CI may clone into /tmp): their first component only
    bound = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, Path(flashlib.__file__).parent)}
    under_tmp = {b.relative_to("/tmp").parts[0] for b in bound if b.is_relative_to("/tmp")}
    assert set(seen["tmp"]) <= under_tmp, (seen["tmp"], under_tmp)
    assert seen["/proc/sys/kernel/core_pattern"] in ("Read-only file system", "Permission denied")
    assert seen["/usr/flashlib_probe"] in ("Read-only file system", "Permission denied")
    assert seen["/dev/null"] == seen["/dev/shm/probe"] == seen["mine.txt"] == "writable"


def test_answers_are_removed_from_the_copy(tmp_path):
    """Issue 55: the copy of flashlib a student sees has the grader's FLASHLIB_ANSWERS' bodies
    replaced by a raise (a @triton.jit one too), and no bytecode; the rest is intact."""
    from flashlib.course import copies

    names = ("flashlib.teach.softmax.safe_softmax", "flashlib.kernels.tile.tile_update")
    package = copies.flashlib_copy(tmp_path, names)
    assert not list(package.rglob("*.pyc"))
    softmax = (package / "teach" / "softmax.py").read_text()
    original = (ROOT / "flashlib" / "teach" / "softmax.py").read_text()
    assert "safe_softmax is flashlib's own answer" in softmax and len(softmax) < len(original)
    assert "def online_softmax" in softmax
    tile = (package / "kernels" / "tile.py").read_text()
    assert "flashlib.kernels.tile.tile_update is flashlib's own answer" in tile
    result = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, %r); "
                             "import flashlib.teach.softmax as s, numpy as np; "
                             "print(s.online_softmax(np.zeros(3)).sum()); s.safe_softmax(1)"
                             % str(tmp_path)], capture_output=True, text=True)
    assert result.stdout.strip() == "1.0" and "own answer to an exercise" in result.stderr


def test_answers_named_through_a_class_or_an_importer_are_removed(tmp_path):
    """Issue 55: an answer may be a class's method (``flashlib.decode.PagedKVCache.append``) or be
    named through a module that imports it (``flashlib.kernels.decode.attend_key_blocks``, defined
    in fa2_fwd.py): the copy removes it where it is defined, and the in-process tripwire swaps it
    where it is named, records a call from the graded file, and puts it back."""
    from flashlib import decode
    from flashlib.course import copies, integrity
    from flashlib.kernels import decode as decode_kernels, fa2_fwd

    names = ("flashlib.decode.PagedKVCache.append", "flashlib.kernels.decode.attend_key_blocks")
    package = copies.flashlib_copy(tmp_path, names)
    paged = (package / "decode.py").read_text()
    assert "flashlib.decode.PagedKVCache.append is flashlib's own answer" in paged
    assert "def release(self, b):" in paged and "self._free.pop()" not in paged
    fwd = (package / "kernels" / "fa2_fwd.py").read_text()
    assert "flashlib.kernels.decode.attend_key_blocks is flashlib's own answer" in fwd
    assert "def attend_tile(" in fwd and "_fa2_fwd_kernel" in fwd
    assert "own answer" not in (package / "kernels" / "decode.py").read_text()
    file = tmp_path / "learner.py"
    file.write_text("def append(cache, k, v):\n    cache.append(k, v)\n")
    learner = course.load_module(file)
    append, attend = decode.PagedKVCache.append, decode_kernels.attend_key_blocks
    cache = decode.PagedKVCache(1, 1, 32, 16, page_size=16, dtype=torch.float32, device="cpu")
    with integrity.tripwire(names, file) as calls:
        assert decode_kernels.attend_key_blocks is not attend
        assert fa2_fwd.attend_key_blocks is attend               # flashlib's own kernel keeps it
        cache.append(torch.ones(1, 1, 1, 16), torch.ones(1, 1, 1, 16))    # the grader's: unseen
        assert calls == []
        learner.append(cache, torch.ones(1, 1, 1, 16), torch.ones(1, 1, 1, 16))
    assert calls == ["flashlib.decode.PagedKVCache.append"] and cache.lengths == [2]
    assert decode.PagedKVCache.append is append and decode_kernels.attend_key_blocks is attend


WITHHELD = ["ex05b", "ex06", "ex07b", "ex09", "ex10", "ex13"]   # issue 55's: withheld nothing before


@pytest.mark.skipif(torch.cuda.is_available(), reason="grade runs kernels through the "
                    "interpreter; in-process grading here would use the GPU")
def test_withheld_answers_cannot_be_borrowed(tmp_path, grader_seed):
    """Issue 55: the answers of ex05b, ex06, ex07b, ex09, ex10 and ex13 are withheld too. Students
    who reach flashlib's own answers by a name built at run time (name_borrower) or by executing
    flashlib's source afresh under a new name, or reading its text (source_borrower: in-process,
    where flashlib is whole, it passes) score 0, the error naming the removed answer; torch behind a kernel's launch
    (kernel_faker) scores 0 too; the reference answers are graded as in-process."""
    from flashlib.course import copies

    names = {course.short(n): n for n in course.list_exercises(ROOT)}
    for ex in WITHHELD:                      # every grader names answers, and each is flashlib's
        grader = (ROOT / "tests" / "exercises" / f"test_{names[ex]}.py").read_text()
        assert copies.answer_names(grader), ex
        assert all(copies._definition(a) is not None for a in copies.answer_names(grader)), ex
    for student in ("name_borrower", "source_borrower"):
        shutil.copytree(HOSTILE / student, tmp_path / student)
    (tmp_path / "kernel_faker").mkdir()                 # the mutants' torch one-liners, as a student
    for ex in ("ex05b", "ex07b"):
        shutil.copy(ROOT / "tests" / "mutants" / f"{ex}_torch_one_liner.py",
                    tmp_path / "kernel_faker" / f"{names[ex]}.py")
    (tmp_path / "ada").mkdir()
    for ex in WITHHELD:
        shutil.copy(ROOT / "solutions" / f"{names[ex]}.py", tmp_path / "ada")
    rows = classroom.grade(tmp_path, out=None, timeout=120, jobs=2, exercises=WITHHELD,
                           seed=grader_seed, progress=False, unconfined=True)
    got = {(r["student"], r["exercise"][:len(r["exercise"].split("_")[0])]): r for r in rows}
    for ex in WITHHELD:
        file = tmp_path / "ada" / f"{names[ex]}.py"
        assert (got["ada", ex]["status"], got["ada", ex]["passed"]) == \
            ("passed", got["ada", ex]["total"]) == _in_process(file, names[ex], grader_seed), ex
    borrowed = {"ex05b": "flashlib.kernels.primer.matmul_kernel",
                "ex07b": "flashlib.kernels.fa2_fwd._fa2_fwd_kernel",
                "ex09": "flashlib.masks.", "ex10": "flashlib.teach.tiled.merge_states",
                "ex13": "flashlib.decode.PagedKVCache.append"}
    for (student, ex), row in got.items():
        if student == "ada":
            continue
        if not (tmp_path / student / f"{names[ex]}.py").is_file():
            assert row["status"] == "missing", row
            continue
        assert row["passed"] == 0, row
        if (student, ex) == ("source_borrower", "ex06"):   # reads the text: gone from the copy
            assert row["status"].startswith("error: your file fails on import: RuntimeError: "
                                            "nothing to borrow"), row
        elif student != "kernel_faker":               # (a long message is cut in the middle)
            assert row["status"].startswith("error: ") and borrowed[ex] in row["status"] and \
                "removed from the copy of flashlib" in row["status"], row
    for ex in ("ex06", "ex09"):                       # the answers, where flashlib is whole
        source = tmp_path / "source_borrower" / f"{names[ex]}.py"
        assert _in_process(source, names[ex], grader_seed)[0] == "passed", ex


def test_grade_and_exercises_readme_say_the_same_about_what_is_prevented():
    """Issues 36 and 55: exercises/README.md and what `grade` prints agree on the limits and on
    what is not prevented."""
    printed = classroom.limits("bubblewrap", "", 60, 4)
    readme = " ".join((ROOT / "exercises" / "README.md").read_text().split())
    for phrase in (f"at most {sandbox.NPROC} processes and threads", "65534", "checks of",
                   "forked children", "using the CPU until the time limit",
                   "pipe buffers, a 16 MB /dev/shm"):
        assert phrase in printed, phrase
        assert phrase in readme, phrase
