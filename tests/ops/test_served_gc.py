"""A served worker moves its start-up's objects out of the cycle collector's way (issue #32).

A full collection walked the ~180,000 objects a worker makes at start-up (50-150 ms on the
CI machine), and every request in flight on that worker waited it out: the submissions' p99.
``isthmus serve`` runs ``create_served_app``, which freezes them once started; an app made
in-process (tests, embedded benchmarks) does not, since one process makes many. The effect on
the p99 is measured in docs/benchmarks.md, not here.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, sys
from fastapi.testclient import TestClient
from gateway.app import create_app, create_served_app
factory = create_served_app if sys.argv[1] == "served" else create_app
with TestClient(factory()) as c:
    assert c.get("/healthz").status_code == 200
    print(gc.get_freeze_count())
"""


def frozen_after_start(tmp_path, kind: str) -> int:
    env = {"ISTHMUS_DEV_MODE": "true", "ISTHMUS_DATABASE_URL": f"sqlite:///{tmp_path}/{kind}.db",
           "ISTHMUS_DEV_KEY_PATH": str(tmp_path / "dev.pem"), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-m", "gateway.cli", "migrate"], env=env, check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-c", PROBE, kind], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.strip().splitlines()[-1])


def test_a_served_worker_freezes_its_start_up_and_an_in_process_app_does_not(tmp_path):
    assert frozen_after_start(tmp_path, "served") > 50_000
    assert frozen_after_start(tmp_path, "in-process") == 0
