"""A Slurm job's output, per worker, through the API and the CLI (real Slurm 25.11 cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    wired_gateway,
)
from tests.jobs.live import served

pytestmark = pytest.mark.slurm("25.11")  # off 22.05, the busiest lane
FINAL = ("succeeded", "failed", "cancelled")
ISTHMUS = str(Path(sys.executable).with_name("isthmus"))
SCRIPT = 'echo "w$SLURM_PROCID start"; for i in 1 2 3 4; do echo "w$SLURM_PROCID line $i"; sleep 1; done; ' \
         'echo "w$SLURM_PROCID to stderr" >&2'


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster):
    # One database is enough (tests/conftest.py: cluster tests run on Postgres).
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        yield gw


def test_slurm_output_per_worker_live_and_after_the_end_for_the_owner_only(gw):
    h = gw.headers("alice", ("team-a",))
    body = {"name": "logs", "account": "team-a", "backend": "slurm", "workers": 2, "gpus_per_worker": 1,
            "time_limit": "5m", "command": ["/bin/sh", "-c", SCRIPT]}
    job = gw.client.post("/v1/jobs", json=body, headers=h).json()["id"]
    drive_until(gw, lambda: job_state(gw, job, "running", *FINAL), timeout_s=60)
    chunks: list[tuple[float, bytes]] = []
    with served(gw.app) as url:
        def follow():
            with httpx.stream("GET", f"{url}/v1/jobs/{job}/logs", params={"worker": 1, "follow": "true"},
                              headers=h, timeout=httpx.Timeout(10, read=120)) as r:
                assert r.status_code == 200, r.read()
                for chunk in r.iter_raw():
                    chunks.append((time.monotonic(), chunk))
        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        final = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=120)
        ended_at = time.monotonic()
        assert final["state"] == "succeeded", final
        reader.join(30)
        assert not reader.is_alive(), "follow did not end after the job ended"
        followed = b"".join(c for _, c in chunks).decode()
        assert followed.splitlines() == ["w1 start", "w1 line 1", "w1 line 2", "w1 line 3", "w1 line 4",
                                         "w1 to stderr"], followed
        assert chunks[0][0] < ended_at - 1, "follow saw nothing before the job ended"

        # After the end: each worker's own output, the tail, and the CLI.
        w0 = gw.client.get(f"/v1/jobs/{job}/logs", params={"worker": 0}, headers=h)
        assert w0.status_code == 200 and w0.headers["content-type"].startswith("text/plain")
        assert w0.text.splitlines()[0] == "w0 start" and "w1" not in w0.text
        tail = gw.client.get(f"/v1/jobs/{job}/logs", params={"worker": 1, "tail": 2}, headers=h)
        assert tail.text == "w1 line 4\nw1 to stderr\n"
        env = {**os.environ, "ISTHMUS_URL": url, "ISTHMUS_TOKEN": gw.token("alice", ("team-a",))}
        cli = subprocess.run([ISTHMUS, "logs", job, "--worker", "1"], env=env, capture_output=True,
                             text=True, timeout=60, check=False)
        assert cli.returncode == 0 and cli.stdout == followed, cli.stderr
        cli_f = subprocess.run([ISTHMUS, "logs", job, "-w", "0", "-f", "--tail", "1"], env=env,
                               capture_output=True, text=True, timeout=60, check=False)
        assert cli_f.returncode == 0 and cli_f.stdout == "w0 to stderr\n", cli_f.stderr
        env_other = {**env, "ISTHMUS_TOKEN": gw.token("mallory", ("team-b",))}
        denied = subprocess.run([ISTHMUS, "logs", job], env=env_other, capture_output=True, text=True,
                                timeout=60, check=False)
        assert denied.returncode == 1 and "404" in denied.stderr
    other = gw.client.get(f"/v1/jobs/{job}/logs", headers=gw.headers("mallory", ("team-b",)))
    assert other.status_code == 404
