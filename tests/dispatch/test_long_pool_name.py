"""A pool name of 63 characters on Postgres, on the real Slurm 22.05 cluster (issue #28).

`job.estimated_pool` was String(16) while a pool name may have 63 characters. On Postgres, as
soon as one job had to wait on a pool with a longer name, the round that wrote its estimate
failed (StringDataRightTruncation), every later round failed the same way, and no job was
dispatched to any pool again. Here a whole-pool job runs, a second one waits (and so gets an
estimate naming the pool), and both must still run to the end.
"""

from __future__ import annotations

import pytest

from gateway.kit.names import POOL_NAME, POOL_NAME_LEN
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    wired_gateway,
)

pytestmark = pytest.mark.slurm
FINAL = ("succeeded", "failed", "cancelled")
POOL = "slurm-a100-frankfurt-production-" + "x" * 30 + "1"


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {POOL: {"kind": "slurm", **slurm_backend_options(slurm_cluster)}},
                       scheduling_policy="reservation") as gw:
        yield gw


def test_a_63_character_pool_name_keeps_dispatching_when_a_job_waits(gw):
    assert len(POOL) == POOL_NAME_LEN and POOL_NAME.fullmatch(POOL)
    headers = gw.headers("alice", ("team-a",))
    body = {"account": "team-a", "pool": POOL, "workers": 4, "gpus_per_worker": 8, "time_limit": "1m"}
    first = gw.client.post("/v1/jobs", json={**body, "name": "first", "command": ["sleep", "3"]}, headers=headers)
    assert first.status_code == 202, first.text
    first_id = first.json()["id"]
    drive_until(gw, lambda: job_state(gw, first_id, "running", *FINAL), timeout_s=60)

    second = gw.client.post("/v1/jobs", json={**body, "name": "second", "command": ["true"]}, headers=headers)
    assert second.status_code == 202, second.text
    second_id = second.json()["id"]
    gw.app.state.dispatcher.run_once()  # the round that records the waiting job's estimate
    waiting = job_state(gw, second_id, "pending")
    assert waiting is not None, "the second whole-pool job should wait while the first runs"
    assert waiting["estimated_pool"] == POOL, waiting

    for job_id in (first_id, second_id):
        done = drive_until(gw, lambda j=job_id: job_state(gw, j, *FINAL), timeout_s=90)
        assert done["state"] == "succeeded", done
        assert done["assigned_pool"] == POOL, done
