"""Imported at start-up by the Python processes the tests start (tests/conftest.py puts this
folder on PYTHONPATH): the same garbage-collector threshold as the test processes. It hides a
system Python's own sitecustomize (Debian's and Ubuntu's install a crash reporter) in them."""

import gc

# Tracing a program makes millions of short-lived objects; with the default first threshold
# (700) the collector's passes were ~5% of a `train.py smoke` on a fresh cache.
gc.set_threshold(100_000, 10, 10)  # (700, 10, 10) by default
