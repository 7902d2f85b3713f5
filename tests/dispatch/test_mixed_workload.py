"""Both real pools behind one gateway: fair-share order, quotas across pools, usage in one ledger.

Three accounts with different shares. team-a and team-b first build up usage (team-a much
more); then all three submit whole-pool gangs with `backend: auto` (team-a first, so age
alone would favour it). The gateway must dispatch team-c (no usage) first, then team-b,
then team-a; team-a's 32-GPU quota, which counts BOTH pools, must keep its two gangs from
running at once although both pools are free; and every job's usage lands in the ledger
under the pool it ran in.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.models.jobs import Job, JobEvent
from tests.dispatch.conftest import (
    KWOK_RUN_FOR,
    drive_until,
    kube_backend_options,
    slurm_backend_options,
    wired_gateway,
)

pytestmark = [pytest.mark.slurm, pytest.mark.kubernetes]
FINAL = {"succeeded", "failed", "cancelled"}
ADMIN = dict(user="root", groups=(), admin=True)
USERS = {"team-a": "alice", "team-b": "bob", "team-c": "carol"}


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster, kube):
    backends = {"slurm": slurm_backend_options(slurm_cluster), "kubernetes": kube_backend_options(kube)}
    with wired_gateway(database_url, dev_key_path, backends) as gw:
        yield gw


def submit(gw, account, **spec):
    body = {"name": f"{account}-job", "account": account, "backend": "auto", "workers": 4, "gpus_per_worker": 8,
            "command": ["sleep", "3"], "labels": {KWOK_RUN_FOR: "3s"}, "time_limit": "10m", **spec}
    user = USERS[account]  # real POSIX users of the test cluster
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers(user, (account,)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def all_final(gw, ids):
    with gw.session() as s:
        return all(s.get(Job, i).state in FINAL for i in ids)


def test_fair_share_orders_both_pools_and_quota_spans_them(gw):
    admin = gw.headers(**ADMIN)
    for name, shares in (("team-a", 1), ("team-b", 2), ("team-c", 1)):
        if name == "team-c":
            r = gw.client.post("/v1/admin/accounts", json={"name": name, "shares": shares}, headers=admin)
            assert r.status_code == 201, r.text
        else:
            assert gw.client.patch(f"/v1/admin/accounts/{name}", json={"shares": shares},
                                   headers=admin).status_code == 200
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus": 32}, headers=admin)
    assert r.status_code == 200, r.text

    # history: team-a uses a lot (32 GPUs on Slurm), team-b a little (8 GPUs on Kubernetes)
    hist = [submit(gw, "team-a", backend="slurm", command=["sleep", "4"]),
            submit(gw, "team-b", backend="kubernetes", workers=1, labels={KWOK_RUN_FOR: "2s"})]
    drive_until(gw, lambda: all_final(gw, hist), timeout_s=120)
    fs = {row["account"]: row["factor"] for row in
          gw.client.get("/v1/admin/fairshare", headers=admin).json()["items"]}
    assert fs["team-c"] > fs["team-b"] > fs["team-a"], fs

    # the contest starts from idle pools (Kueue updates ClusterQueue usage asynchronously)
    def idle():
        views = gw.app.state.dispatcher.views(fresh=True)
        return views["slurm"].idle_nodes == views["slurm"].total_nodes and \
            views["kubernetes"].free_gpus == views["kubernetes"].total_gpus
    drive_until(gw, idle, timeout_s=60)
    # every gang needs a whole pool; team-a submits first
    wave = {acc: [submit(gw, acc), submit(gw, acc)] for acc in ("team-a", "team-b", "team-c")}
    ids = [j for js in wave.values() for j in js]
    drive_until(gw, lambda: all_final(gw, ids), timeout_s=300, interval_s=0.3)

    with gw.session() as s:
        jobs = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(ids)))}
        dispatched = list(s.execute(select(JobEvent.job_id, JobEvent.at).where(
            JobEvent.job_id.in_(ids), JobEvent.to_state == "dispatching").order_by(JobEvent.id)).all())
    assert {j.state for j in jobs.values()} == {"succeeded"}, {j.id: (j.state, j.state_reason) for j in jobs.values()}
    order = [jobs[jid].account_name for jid, _ in dispatched]
    assert len(order) == 6
    # fair share: team-c's gangs go first, then team-b's, team-a's last
    assert order[:2] == ["team-c", "team-c"] and order[2:4] == ["team-b", "team-b"], order
    assert order[4:] == ["team-a", "team-a"], order
    # team-c's two gangs ran at the same time, one in each pool
    c1, c2 = (jobs[j] for j in wave["team-c"])
    assert {c1.pool, c2.pool} == {"slurm", "kubernetes"}
    # team-a's quota (32 GPUs across both pools) serialised its two gangs
    a1, a2 = sorted((jobs[j] for j in wave["team-a"]), key=lambda j: j.started_at)
    assert a2.started_at >= a1.ended_at, (a1.started_at, a1.ended_at, a2.started_at)
    with gw.session() as s:
        reasons = [e.reason for e in s.scalars(select(JobEvent).where(JobEvent.job_id == a2.id))]
    assert any("quota" in r and "32" in r for r in reasons), reasons

    # usage landed in the one ledger, per pool
    usage = gw.client.get("/v1/admin/usage", headers=admin).json()["items"]
    per = {(u["account"], u["pool"]): u["usage_gpu_seconds"] for u in usage}
    assert per[("team-c", "slurm")] > 0 and per[("team-c", "kubernetes")] > 0, per
    assert per[("team-a", "slurm")] > 0 and per[("team-b", "kubernetes")] > 0, per
    assert gw.client.get("/v1/admin/ledger?account=team-c", headers=admin).json()["items"]
