"""Hostile: hands in flashlib's own implementation. Expected: not accepted: write it yourself."""
from flashlib.teach.softmax import safe_softmax  # noqa: F401
