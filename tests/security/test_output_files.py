"""A job's output file is the job's to replace: the gateway must read it only as a plain file
(issue #45, findings 1 and 2; docs/security.md 45.1-45.2).

Real jobs on a real Slurm cluster replace their own output file, as bob's job did in the
review: with a symbolic link to a file only the gateway can read (the pool's Slurm JWT key),
and with a FIFO. The logs route must refuse both at once with problem+json, the dashboard's
output view too, and a burst of such reads must leave the gateway answering other callers.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.dispatch.conftest import (  # noqa: F401  (slurm_cluster: a fixture)
    drive_until,
    job_state,
    slurm_backend_options,
    slurm_cluster,
    wired_gateway,
)
from tests.jobs.live import served

pytestmark = pytest.mark.slurm("26.05")
FINAL = ("succeeded", "failed", "cancelled")
BOB = ("bob", ("team-b",))


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        gw.env, gw.swapped = slurm_cluster, []
        try:
            yield gw
        finally:  # the link or FIFO a job left (a FIFO would block any later reader of the directory)
            for job in gw.swapped:
                _output_path(gw, job).unlink(missing_ok=True)


def _replacing_job(gw, replace: str) -> str:
    """bob's job: prints a mark, finds its own output file by it, and swaps it for ``replace``."""
    mark = f"mark-{uuid.uuid4().hex}"
    script = (f'echo {mark}; out=; while [ -z "$out" ]; do sleep 0.2; '
              f'for f in isthmus-*-worker-$SLURM_PROCID.out; do [ -f "$f" ] && [ ! -L "$f" ] && '
              f'grep -q {mark} "$f" && out=$f; done; done; rm -f "$out"; {replace} "$out"; sleep 120')
    r = gw.client.post("/v1/jobs", headers=gw.headers(*BOB), json={
        "name": "swap", "account": "team-b", "backend": "slurm", "workers": 1, "gpus_per_worker": 1,
        "time_limit": "5m", "command": ["/bin/sh", "-c", script]})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    gw.swapped.append(job)
    drive_until(gw, lambda: job_state(gw, job, "running", *FINAL), timeout_s=90)
    return job


def _wait_swapped(path: Path, check) -> None:
    deadline = time.monotonic() + 30
    while not check(path):
        assert time.monotonic() < deadline, f"the job never replaced {path}"
        time.sleep(0.2)


def _output_path(gw, job: str) -> Path:
    return Path(gw.env["SLURM_WORK_DIR"]) / f"isthmus-{job}-worker-0.out"


def test_an_output_file_replaced_by_a_link_is_refused_and_the_linked_secret_never_sent(gw):
    secret = Path(gw.env["SLURM_JWT_KEY"]).read_bytes()
    job = _replacing_job(gw, f"ln -s {gw.env['SLURM_JWT_KEY']}")
    _wait_swapped(_output_path(gw, job), Path.is_symlink)

    for params in ({}, {"tail": 5}, {"follow": "true"}):
        r = gw.client.get(f"/v1/jobs/{job}/logs", params=params, headers=gw.headers(*BOB))
        assert r.status_code == 409, (params, r.status_code, r.content[:200])
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"].endswith("output-refused") and "symbolic link" in r.json()["detail"]
        assert secret not in r.content
    page = gw.client.get(f"/v1/jobs/{job}/logs", headers=gw.headers("root", (), admin=True))
    assert page.status_code == 409 and secret not in page.content  # an admin's read follows no link either
    gw.client.delete(f"/v1/jobs/{job}", headers=gw.headers(*BOB))


def test_a_fifo_in_place_of_the_output_is_refused_at_once_and_the_gateway_keeps_answering(gw):
    job = _replacing_job(gw, "mkfifo")
    _wait_swapped(_output_path(gw, job), lambda p: p.exists() and not p.is_file())

    with served(gw.app) as url:
        h = gw.headers(*BOB)
        alice = gw.headers("alice", ("team-a",))

        def read(_: int) -> int:
            return httpx.get(f"{url}/v1/jobs/{job}/logs", headers=h, timeout=20).status_code

        # More reads at once than the threads the synchronous routes share (40): before the
        # fix each blocked one in open() for good.
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            codes = list(pool.map(read, range(48)))
        # 409 (refused) for each read the caller's stream limit (10) lets through, 429 beyond.
        assert set(codes) <= {409, 429} and 409 in codes, codes
        assert time.monotonic() - start < 15, "reads of a FIFO were not refused at once"
        for path in ("/healthz", "/v1/me", "/v1/jobs"):
            assert httpx.get(f"{url}{path}", headers=alice, timeout=5).status_code == 200, path
        r = httpx.get(f"{url}/v1/jobs/{job}/logs", headers=h, timeout=5)
        assert r.status_code == 409 and "FIFO" in r.json()["detail"], r.text
    gw.client.delete(f"/v1/jobs/{job}", headers=gw.headers(*BOB))
