"""Hostile: makes the grader's own work slow. It writes its reply straight into the grader's pipe
(the pipe's number is in its command line): a dict of 100,000 integer keys that all hash alike,
about 1.4 MB that take the grader's unpickler minutes to rebuild (each key is compared with all
the previous ones), and costs the student nothing to write. Expected: timeout (the deadline
covers the grader's work on a reply), 0 points."""
import json
import os
import pickle
import sys
import time

STEP = (1 << 61) - 1                     # hash(k * STEP) == 0 for every int k


def safe_softmax(x):
    items = bytearray()
    for k in range(1, 100_001):
        key = (k * STEP).to_bytes(11, "little", signed=True)
        items += b"\x8a\x0b" + key + b"K\x00"          # LONG1 key, BININT1 0
    body = b"\x80\x04}\x8c\x06result}(" + bytes(items) + b"us."   # {"result": {...}}
    outer = pickle.dumps((body, []), protocol=4)
    rep = json.loads(sys.argv[2])["rep"]
    data = len(outer).to_bytes(4, "big") + outer
    while data:
        data = data[os.write(rep, data[:1 << 16]):]
    time.sleep(600)
