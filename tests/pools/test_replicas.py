"""Two gateways on one database agree on a pool's state (issue #47, item 2).

Two replicas of the gateway (two apps, each with its own dispatcher, pool catalogue and caches)
on one fresh Postgres database, configured with two of the stack's Slurm clusters (``slurm-22``
and ``slurm-24`` of ``.stack/pools.yaml``). An admin drains ``slurm-24`` through replica A; the
other replica must honour it without being told:

- B's dispatch round sends nothing new there from its very next round (a round reads each
  pool's row fresh from the database: gateway/dispatch/claim.py ``views(fresh=True)``);
- B's ``GET /v1/pools`` and its never-fits check at submit read its capacity snapshot, which
  is at most ``capacity_ttl_s`` old (docs/architecture.md "Replicas"): B answers ``draining`` once
  that has passed, with no call between the replicas.

A piece of process-local state that a decision depends on would make B disagree here.
Skips without the stack; fails with ISTHMUS_REQUIRE_STACK=1.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import yaml

from tests.conftest import REPO, missing_system, postgres_database
from tests.dispatch.conftest import (
    KWOK_RUN_FOR,
    drive_until,
    job_state,
    wired_gateway,
)

pytestmark = [pytest.mark.slurm("22.05", "24.11"), pytest.mark.postgres]

POOLS_FILE = REPO / ".stack" / "pools.yaml"
TWO = ("slurm-22", "slurm-24")
TTL_S = 0.5  # replica B's capacity snapshot age bound


@pytest.fixture(scope="module")
def pools_file(tmp_path_factory):
    if not POOLS_FILE.is_file():
        missing_system(f"{POOLS_FILE} missing: the test stack is not up (stack/up.sh writes it)")
    pools = [p for p in yaml.safe_load(POOLS_FILE.read_text())["pools"] if p["name"] in TWO]
    if tuple(p["name"] for p in pools) != TWO:
        missing_system(f"{POOLS_FILE} does not list {TWO}")
    path = tmp_path_factory.mktemp("replicas") / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": pools}))
    return path


def pool_states(gw) -> dict[str, str]:
    return {p["name"]: p["state"] for p in gw.client.get("/v1/pools", headers=gw.headers()).json()["items"]}


def test_a_pool_drained_through_one_replica_is_honoured_by_the_other(pools_file, dev_key_path):
    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, pools_file=str(pools_file), capacity_ttl_s=600) as a, \
            wired_gateway(url, dev_key_path, {}, fresh=False, pools_file=str(pools_file), capacity_ttl_s=TTL_S) as b:
        admin = a.headers("root", admin=True)
        assert pool_states(a) == pool_states(b) == {"slurm-22": "active", "slurm-24": "active"}
        try:
            r = a.client.patch("/v1/admin/pools/slurm-24", json={"state": "draining"}, headers=admin)
            assert r.status_code == 200 and r.json()["state"] == "draining", r.text

            # B's next round: nothing new goes to slurm-24, and a job pinned there waits with the reason.
            anywhere = b.client.post("/v1/jobs", json={
                "name": "replica", "account": "team-a", "workers": 1, "gpus_per_worker": 8, "time_limit": "2m",
                "command": ["sleep", "1"], "pool_kind": "slurm", "labels": {KWOK_RUN_FOR: "1s"}}, headers=b.headers())
            pinned = b.client.post("/v1/jobs", json={
                "name": "replica", "account": "team-a", "workers": 1, "gpus_per_worker": 8, "time_limit": "2m",
                "command": ["sleep", "1"], "pool": "slurm-24"}, headers=b.headers())
            assert anywhere.status_code == pinned.status_code == 202, (anywhere.text, pinned.text)
            routed = drive_until(b, lambda: job_state(b, anywhere.json()["id"], "queued", "running", "succeeded",
                                                      "failed"), timeout_s=60)
            assert routed["assigned_pool"] == "slurm-22", routed
            assert "slurm-24: draining" in routed["routing_reason"], routed["routing_reason"]
            held = job_state(b, pinned.json()["id"], "pending")
            assert held and held["assigned_pool"] is None and "draining" in held["state_reason"], held

            # B's own pool listing (its capacity snapshot) shows the state within its bound.
            time.sleep(TTL_S + 0.1)
            assert pool_states(b)["slurm-24"] == "draining"
            # A's snapshot was refreshed by the change it served (same process).
            assert pool_states(a)["slurm-24"] == "draining"

            # Back in service through B: A's next round may send the pinned job there.
            r = b.client.patch("/v1/admin/pools/slurm-24", json={"state": "active"}, headers=admin)
            assert r.status_code == 200, r.text
            moved = drive_until(a, lambda: job_state(a, pinned.json()["id"], "queued", "running", "succeeded",
                                                     "failed"), timeout_s=60)
            assert moved["assigned_pool"] == "slurm-24", moved
        finally:
            a.client.patch("/v1/admin/pools/slurm-24", json={"state": "active"}, headers=admin)
            for gw, job in ((b, anywhere), (a, pinned)):
                with contextlib.suppress(Exception):
                    gw.client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=gw.headers())
