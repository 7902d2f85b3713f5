"""Hostile shapes on a node-exclusive pool: a gang cannot hold whole nodes for the price of
the few (or zero) GPUs it names (issue #12, finding 2). Real Slurm capacity; the jobs never
reach sbatch, because the quota refuses them first."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.ledger import reading as ledger_reading
from gateway.models.ledger import LedgerEntry
from tests.dispatch.conftest import (
    drive_until,
    slurm_backend_options,
    slurm_env,
    wired_gateway,
)

pytestmark = pytest.mark.slurm


@pytest.fixture
def gw(database_url, dev_key_path):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_env("22.05"))}) as gw:
        yield gw


def _job(gw, job_id):
    return gw.client.get(f"/v1/jobs/{job_id}", headers=gw.headers("alice", ("team-a",))).json()


@pytest.mark.parametrize("gpus_per_worker", [0, 1])
def test_a_small_quota_does_not_buy_whole_nodes(gw, gpus_per_worker):
    admin = gw.headers("root", (), admin=True)
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus_slurm": 4}, headers=admin)
    assert r.status_code == 200, r.text
    r = gw.client.post("/v1/jobs", headers=gw.headers("alice", ("team-a",)), json={
        "name": "sneaky", "account": "team-a", "backend": "slurm", "workers": 2,
        "gpus_per_worker": gpus_per_worker, "command": ["sleep", "600"], "time_limit": "30d"})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    waiting = drive_until(gw, lambda: (j := _job(gw, job))["state_reason"].startswith("quota") and j, timeout_s=30)
    # 2 workers hold 2 whole nodes of 8 GPUs: 16 GPUs, far over the 4 allowed.
    assert waiting["state"] == "pending", waiting
    assert "job needs 16" in waiting["state_reason"], waiting["state_reason"]
    assert waiting["backend_job_id"] is None and waiting["held_gpus"] is None
    with gw.session() as s:
        assert s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job)).all() == []
        assert ledger_reading.verify(s) == []


def test_a_user_cannot_name_what_the_gang_holds(gw):
    r = gw.client.post("/v1/jobs", headers=gw.headers("alice", ("team-a",)), json={
        "name": "sneaky", "account": "team-a", "backend": "slurm", "workers": 1, "gpus_per_worker": 0,
        "held_gpus": 0, "command": ["true"]})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == ["body.held_gpus"]
    assert gw.client.get("/v1/jobs", headers=gw.headers("alice", ("team-a",))).json()["items"] == []
