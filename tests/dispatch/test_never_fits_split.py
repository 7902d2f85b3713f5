"""The never-fits check at submit when dispatch runs in another process (issue #28).

``isthmus serve`` beside ``isthmus worker``: the API process has no capacity snapshot of its
own. It judges a submission on the limits the worker's dispatcher stored for each pool
(gateway/pools/service.py ``stored_views``), so a job that can never fit is refused with the
same 422 as on a gateway that dispatches in-process, instead of waiting to be failed later.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, select

from gateway.models.pools import Pool
from tests.dispatch.conftest import slurm_cluster  # noqa: F401  (fixture)
from tests.dispatch.test_faults import gateway, pg_url, wait_states, workers  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slurm, pytest.mark.postgres]

HUGE = {"name": "huge", "account": "team-a", "pool": "slurm", "command": ["true"], "workers": 64,
        "gpus_per_worker": 8, "time_limit": "5m"}


def stored_limits(url: str) -> dict | None:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(select(Pool.limits).where(Pool.name == "slurm")).scalar()
    finally:
        engine.dispose()


def test_an_api_process_without_a_dispatcher_refuses_what_can_never_fit(gateway, workers, pg_url):
    h = gateway.headers("alice", ("team-a",))
    # Before any dispatcher has looked at the pool nothing is known: accepted, and failed by
    # the dispatcher with the reason once it knows (the documented fallback).
    early = gateway.client.post("/v1/jobs", json=HUGE, headers=h)
    assert early.status_code == 202, early.text

    workers.start()
    deadline = time.monotonic() + 60
    while stored_limits(pg_url) is None:
        assert time.monotonic() < deadline, "the worker never stored the pool's limits"
        time.sleep(0.3)
    assert gateway.app.state.dispatcher.latest_views() == {}  # this process has no snapshot of its own

    r = gateway.client.post("/v1/jobs", json=HUGE, headers=h)
    assert r.status_code == 422, r.text
    body = r.json()
    assert "never run" in body["detail"] and "64 whole nodes" in body["detail"], body
    typed = gateway.client.post("/v1/jobs", json={**HUGE, "pool": "auto", "workers": 1, "gpu_type": "b300"},
                                headers=h)
    assert typed.status_code == 422 and "no b300 GPUs" in typed.json()["detail"], typed.text
    fits = gateway.client.post("/v1/jobs", json={**HUGE, "workers": 1}, headers=h)
    assert fits.status_code == 202, fits.text
    # The one accepted before the limits were known is failed with the same words.
    wait_states(pg_url, [early.json()["id"]], {"failed"}, timeout_s=60)
    failed = gateway.client.get(f"/v1/jobs/{early.json()['id']}", headers=h).json()
    assert "64 whole nodes" in failed["state_reason"], failed
    gateway.client.post(f"/v1/jobs/{fits.json()['id']}/cancel", headers=h)
