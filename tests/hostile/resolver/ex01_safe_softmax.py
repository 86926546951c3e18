"""Hostile: reaches flashlib's own answer by a name built at run time, which no static check sees.
Expected: every check fails (the answer is withheld in the student process), 0 points."""
import pkgutil

_answer = pkgutil.resolve_name("flashlib.teach." + "softmax:safe_softmax")


def safe_softmax(x):
    return _answer(x)
