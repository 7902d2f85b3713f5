"""A job that cannot run within its GPU-hour budget is refused or held, and says why (#14, 4)."""

from __future__ import annotations

import pytest

from tests.dispatch.conftest import slurm_backend_options, wired_gateway

pytestmark = pytest.mark.slurm


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        admin = gw.headers("root", (), admin=True)
        r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"budget_gpu_hours": 10}, headers=admin)
        assert r.status_code == 200, r.text
        yield gw


def job(**kw):
    return {"name": "b", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 8, **kw}


def test_a_job_bigger_than_the_whole_budget_is_refused_at_submit(gw):
    r = gw.client.post("/v1/jobs", json=job(time_limit="2h"), headers=gw.headers())  # 16 GPU-h > 10
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "body.time_limit"
    assert ("team-a's monthly GPU-hour budget is 10.0 GPU-hours and this job needs 16.0"
            in r.json()["errors"][0]["message"])
    assert gw.client.get("/v1/jobs", headers=gw.headers()).json()["items"] == []


def test_a_job_over_what_is_left_this_month_is_held_with_that_reason_not_capacity(gw):
    admin = gw.headers("root", (), admin=True)
    r = gw.client.post("/v1/admin/ledger/adjustments", headers=admin,
                       json={"account": "team-a", "kind": "debit", "gpu_hours": 6, "reason": "used elsewhere"})
    assert r.status_code == 201, r.text
    r = gw.client.post("/v1/jobs", json=job(time_limit="40m"), headers=gw.headers())  # 5.3 GPU-h > 4 left
    assert r.status_code == 202, r.text
    held = "held: team-a's GPU-hour budget this month has 4.0 of 10.0 GPU-hours left and this job needs 5.3"
    assert r.json()["state_reason"].startswith(held)
    for _ in range(3):
        gw.app.state.dispatcher.run_once()
    shown = gw.client.get(f"/v1/jobs/{r.json()['id']}", headers=gw.headers()).json()
    assert shown["state"] == "pending" and shown["state_reason"].startswith(held), shown["state_reason"]
    assert "idle" not in shown["state_reason"] and "capacity" not in shown["state_reason"]
    # A credit makes room: the same job is dispatched.
    r = gw.client.post("/v1/admin/ledger/adjustments", headers=admin,
                       json={"account": "team-a", "kind": "credit", "gpu_hours": 6, "reason": "give back"})
    assert r.status_code == 201, r.text
    gw.app.state.dispatcher.run_once()
    shown = gw.client.get(f"/v1/jobs/{shown['id']}", headers=gw.headers()).json()
    assert shown["state"] != "pending", shown
