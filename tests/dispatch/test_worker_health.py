"""`isthmus worker --health-port`: a real worker process answers its liveness probe while its
loops run, and goes on dispatching to the real Slurm cluster (gateway/dispatch/health.py; the
Helm chart's worker probe). A hung loop's 503 is tests/unit/test_worker_health.py's."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.dispatch.test_faults import (  # noqa: F401  (fixtures)
    gateway,
    ledger_problems,
    pg_url,
    slurm_backend,
    submit,
    wait_states,
    workers,
)

pytestmark = [pytest.mark.slurm("24.11"), pytest.mark.postgres]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_running_worker_answers_its_probe_and_dispatches(gateway, workers, pg_url):
    port = _free_port()
    w = workers.start(worker_health_port=port, worker_health_host="127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            r = httpx.get(f"{url}/healthz", timeout=5)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline and w.poll() is None, "the worker never served its health port"
            time.sleep(0.2)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and set(body["loops_s_since_pass"]) == {"dispatch", "reconcile"}, body
    assert all(age < body["stale_after_s"] for age in body["loops_s_since_pass"].values()), body
    assert httpx.get(f"{url}/metrics", timeout=5).status_code == 404

    job = submit(gateway, n=1, command=("true",))[0]
    wait_states(pg_url, [job], {"succeeded"}, 90)
    again = httpx.get(f"{url}/healthz", timeout=5)
    assert again.status_code == 200 and max(again.json()["loops_s_since_pass"].values()) < 30, again.text
    assert ledger_problems(gateway) == []
