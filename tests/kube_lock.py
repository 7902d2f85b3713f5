"""The Kubernetes test pool's lock (``.stack/kube/test.lock``), re-entrant within one process.

Tests that assert on the whole ClusterQueue's quota hold it so they never overlap with another
process's tests on the same control plane (``flock``, between processes). Within one pytest
process the adapter suite holds it for the session (tests/backends/kubernetes/conftest.py) and
the dispatch suites per test (tests/dispatch/test_watch.py ``whole_pool``): a second ``flock``
on a new descriptor of the same file would wait for the first forever (a CI run hung on
exactly that), so the process takes it once and counts.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK_FILE = REPO / ".stack" / "kube" / "test.lock"

_guard = threading.Lock()
_held = {"fh": None, "depth": 0}


@contextlib.contextmanager
def kube_pool_lock():
    with _guard:
        if _held["depth"] == 0:
            fh = open(LOCK_FILE, "a")
            fcntl.flock(fh, fcntl.LOCK_EX)
            _held["fh"] = fh
        _held["depth"] += 1
    try:
        yield
    finally:
        with _guard:
            _held["depth"] -= 1
            if _held["depth"] == 0:
                fh, _held["fh"] = _held["fh"], None
                fcntl.flock(fh, fcntl.LOCK_UN)
                fh.close()
