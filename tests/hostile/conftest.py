"""tests/hostile/ holds hostile student submissions (tests/test_classroom.py grades them): never
collect or import them."""
collect_ignore_glob = ["*/*.py"]
