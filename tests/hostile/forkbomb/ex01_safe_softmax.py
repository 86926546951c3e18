"""Hostile: a fork bomb, bounded here at 100 processes (more than the sandbox allows) so that
it stays harmless where grading runs unconfined: forks until fork fails, once, each child a
`sleep` whose argument (@TOKEN@, set by the test) lets the test find any that outlive grading.
Expected (confined): "error: RuntimeError: forked N processes" with N below the sandbox's
process limit (64), and none left afterwards."""
import os


forked, done = 0, []


def safe_softmax(x):
    global forked
    try:
        while forked < 100 and not done:
            if os.fork() == 0:
                try:
                    os.execv("/bin/sleep", ["sleep", "600.@TOKEN@"])
                finally:
                    os._exit(0)
            forked += 1
    except OSError:
        pass
    done.append(True)                   # once: the checks call it again
    raise RuntimeError(f"forked {forked} processes")
