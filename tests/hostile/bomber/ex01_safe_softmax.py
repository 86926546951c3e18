"""Hostile: replies with a list nested 12 deep, ten references to the level below at each level
(about 300 bytes on the wire, 10**12 entries for a grader that walks it). Expected: crashed (a
reply the grader cannot read), 0 points."""


def safe_softmax(x):
    bomb = [0]
    for _ in range(12):
        bomb = [bomb] * 10
    return bomb
