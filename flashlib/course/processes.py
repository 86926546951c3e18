"""The processes of ``flashlib grade``: a pool of grader processes, each watched from outside.

``run_workers`` starts ``jobs`` grader processes (``python -m flashlib.course.classroom
--worker``) and feeds them tasks, one file each; ``supervise`` watches one task: every TICK it
measures the memory of the file's student processes together (``memory_in_use`` over
``descendants``; past the limit they are killed and the row says so), and a grader process still
busy GRACE seconds past the file's deadline (a reply crafted to make the grader's own checks
slow) is stuck: the row is "timeout" and the process is killed with everything below it
(``stop``). Linux /proc only; the student processes' own limits are set inside them
(``student_process.limits``); the grader processes themselves run under RLIMIT_DATA
(``classroom.GRADER_MEMORY``).
"""
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time

from .wire import SandboxGone, SandboxTimeout, read_frame

GRACE = 3.0   # seconds past a file's limit before its grader process is killed (it was stuck)
TICK = 0.1    # seconds between two looks at the memory of a file's processes (at least)


def supervise(proc, timeout, memory):
    """(row, stuck) for the task just sent to grader process ``proc``. Meanwhile, every TICK:
    the memory of its student processes together (past ``memory`` bytes they are killed and
    the file is "crashed (over the memory limit ...)"), and its deadline: a grader process
    still busy GRACE s past the file's limit (a reply crafted to make the grader's own work
    slow) is ``stuck``: the file is "timeout", and the caller kills the process."""
    fd = proc.stdout.fileno()
    began = _receive(fd, None)[1]
    deadline, over, wait = began + timeout + GRACE, None, TICK
    while True:
        if select.select([fd], [], [], wait)[0]:
            row = _receive(fd, deadline)
            return (row if over is None else {**row, "passed": 0, "status": over}), False
        if time.monotonic() > deadline:
            return {"passed": 0, "seconds": round(time.monotonic() - began, 2),
                    "status": f"timeout (over {timeout:g} s, the grader's checks of its "
                              "replies included)"}, True
        if over is not None:
            continue
        looked = time.monotonic()
        pids = descendants(proc.pid)
        if memory_in_use(pids) > memory:
            used = memory_in_use(pids, precise=True)
            if used > memory:
                kill_all(pids)
                over = (f"crashed (over the memory limit: {used / 2**30:.2f} GB in its "
                        f"processes together, {memory / 2**30:g} GB allowed)")
        wait = max(TICK, 4 * (time.monotonic() - looked))   # many processes: look less often


def _receive(fd, deadline):
    data = read_frame(fd, deadline)
    if data is None:
        raise EOFError("the grader process exited")
    return pickle.loads(data)


def stop(proc):
    """Kill a grader process and every process below it."""
    kill_all(descendants(proc.pid))
    proc.kill()
    proc.wait()


def run_workers(tasks, jobs, settings, env, done):
    """``jobs`` grader processes; a thread feeds and watches each (``supervise``); a dead or
    stuck one is replaced. ``done(task, row)`` is called (under a lock) as rows arrive."""
    todo, lock, procs = list(reversed(tasks)), threading.Lock(), []

    def feed():
        proc = None
        while True:
            with lock:
                if not todo:
                    break
                task = todo.pop()
            if proc is None:
                proc = subprocess.Popen([sys.executable, "-m", "flashlib.course.classroom", "--worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                procs.append(proc)
                pickle.dump(settings, proc.stdin)
            try:
                pickle.dump(task, proc.stdin)
                proc.stdin.flush()
                row, stuck = supervise(proc, settings["timeout"], settings["memory"])
            except (EOFError, OSError, pickle.UnpicklingError, SandboxGone,
                    SandboxTimeout):
                row, stuck = {"passed": 0, "status": "crashed (the grader process died)"}, True
            if stuck:
                stop(proc)
                proc = None
            with lock:
                done(task, row)
        if proc is not None:
            proc.stdin.close()
            proc.wait()

    threads = [threading.Thread(target=feed, daemon=True) for _ in range(min(jobs, len(tasks)))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        with lock:
            todo.clear()
        for proc in procs:
            proc.terminate()          # each kills its student process (see _init_worker)
        for proc in procs:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                stop(proc)
        raise


# ---------------------------------------------------------------------------------------------
# what a grader process's student processes use, seen from outside (Linux /proc)

def descendants(pid):
    """Every process below ``pid`` (its children, theirs, ...): in namespaces, a sandbox's
    processes all stay below it (orphans go to the PID namespace's first process)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = []
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids += [int(k) for k in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{parent}"):
                continue
            kids = _children_by_scan(parent)         # a kernel without /proc/PID/task/TID/children
        except OSError:
            continue
        found += kids
        todo += kids
    return found


def _children_by_scan(parent):
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                        kids.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def memory_in_use(pids, precise=False):
    """Bytes of memory ``pids`` hold: anonymous and shared-memory pages they map (RssAnon +
    RssShmem; with ``precise``, proportional shares, so that pages a fork shares are counted
    once) plus the memfd files they hold open, mapped or not."""
    total, seen = 0, set()
    for pid in pids:
        fields = {}
        for name in ((f"/proc/{pid}/smaps_rollup",) if precise else ()) + (f"/proc/{pid}/status",):
            try:
                with open(name) as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                break
            except OSError:
                continue
        keys = ("Pss_Anon", "Pss_Shmem") if "Pss_Anon" in fields else ("RssAnon", "RssShmem")
        total += sum(int(fields.get(k, "0 kB").split()[0]) << 10 for k in keys)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
            except OSError:
                pass
    return total


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
