"""Imported at start-up by every Python process the tests start (tests/conftest.py puts this
folder on PYTHONPATH): the same garbage-collector thresholds as the test processes."""

import gc

# Tracing a program makes millions of short-lived objects; with the default first threshold
# (700) the collector's passes were ~5% of a `train.py smoke` on a fresh cache.
gc.set_threshold(100_000, 50, 100)
