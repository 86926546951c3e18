"""Hostile: copies another student's answer at run time, past the audit hook (`cat` in a
subprocess), and imports it from its own folder. @CLASS@ is set by the test. Expected
(confined: the class folder is hidden): "error: RuntimeError: nothing to copy", 0 points."""
import subprocess

CLASS = "@CLASS@"


def safe_softmax(x):
    text = subprocess.run(["cat", f"{CLASS}/ada/ex01_safe_softmax.py"], capture_output=True,
                          check=False).stdout
    if not text:
        raise RuntimeError("nothing to copy")
    with open("copied.py", "wb") as f:
        f.write(text)
    import copied
    return copied.safe_softmax(x)
