"""Five pools at once on the real systems (#13, item 7).

One gateway configured with ``ISTHMUS_POOLS_FILE=.stack/pools.yaml`` (stack/pools.py): the
Slurm 22.05, 24.11 and 26.05 clusters (``slurm-22``, ``slurm-24``, ``slurm-26``, 4 nodes x 8
GPUs each, no GPU type) and two Kueue ClusterQueues on the one control plane (``kube-a100``:
32 a100 GPUs, ``kube-h100``: 16 h100 GPUs, cost 2), on a fresh Postgres database, driven round
by round like tests/dispatch. Jobs are short: ``sleep 2`` on Slurm, kwok's fake-run label on
Kubernetes (an ``auto`` job carries both). Skips without the stack; fails with
ISTHMUS_REQUIRE_STACK=1.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, missing_system, postgres_database
from tests.dispatch.conftest import KWOK_RUN_FOR, drive_until, job_state, wired_gateway

pytestmark = [pytest.mark.slurm("22.05", "24.11", "26.05"), pytest.mark.kubernetes, pytest.mark.postgres]

FIVE = ("slurm-22", "slurm-24", "slurm-26", "kube-a100", "kube-h100")
SLURM = FIVE[:3]
FINAL = ("succeeded", "failed", "cancelled")
POOLS_FILE = REPO / ".stack" / "pools.yaml"


@pytest.fixture(scope="module")
def five_pools() -> list[dict]:
    if not POOLS_FILE.is_file():
        missing_system(f"{POOLS_FILE} missing: the test stack is not up (stack/up.sh writes it)")
    pools = yaml.safe_load(POOLS_FILE.read_text())["pools"]
    if tuple(p["name"] for p in pools) != FIVE:
        missing_system(f"{POOLS_FILE} does not list the five pools {FIVE}: {[p['name'] for p in pools]}")
    return pools


@pytest.fixture(scope="module")
def pg_url(five_pools):
    with postgres_database(migrated=True) as url:
        yield url


@contextlib.contextmanager
def five_gateway(pg_url, dev_key_path, pools_file: Path = POOLS_FILE):
    with wired_gateway(pg_url, dev_key_path, {}, pools_file=str(pools_file)) as gw:
        gw.admin = gw.headers("root", admin=True)
        views = gw.app.state.dispatcher.views(fresh=True)
        assert set(views) == set(FIVE), sorted(views)
        try:
            yield gw
        finally:
            for name in FIVE:  # an admin's state or weight would win over the file on the next start-up
                gw.client.patch(f"/v1/admin/pools/{name}", json={"state": "active", "weight": 1.0}, headers=gw.admin)


@pytest.fixture
def gw(pg_url, dev_key_path):
    with five_gateway(pg_url, dev_key_path) as gw:
        yield gw


def submit(gw, account: str = "team-a", seconds: int = 2, **spec) -> str:
    body = {"name": "five", "account": account, "workers": 1, "gpus_per_worker": 8, "time_limit": "2m",
            "command": ["sleep", str(seconds)], "labels": {KWOK_RUN_FOR: f"{seconds}s"}, **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=user(gw, account))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def user(gw, account: str) -> dict:
    return gw.headers("alice" if account == "team-a" else "bob", (account,))


def get(gw, job_id: str) -> dict:
    return gw.client.get(f"/v1/jobs/{job_id}", headers=gw.admin).json()


def finish(gw, *job_ids: str, timeout_s: float = 90) -> dict[str, dict]:
    drive_until(gw, lambda: all(job_state(gw, j, *FINAL) for j in job_ids), timeout_s=timeout_s)
    return {j: get(gw, j) for j in job_ids}


def verify_ledger(gw) -> None:
    from gateway.ledger import reading as ledger_reading

    with gw.session() as s:
        assert ledger_reading.verify(s) == []


# ------------------------------------------------------------------ 1. routing


def test_routing_by_gpu_type_kind_and_capacity_across_five_pools(gw):
    h100 = submit(gw, gpu_type="h100")
    on_slurm = [submit(gw, pool_kind="slurm") for _ in range(3)]
    big_kube = submit(gw, pool_kind="kubernetes", workers=3)  # 24 GPUs: more than kube-h100's 16
    gw.app.state.dispatcher.run_once()

    job = get(gw, h100)
    assert job["assigned_pool"] == "kube-h100", job
    reason = job["routing_reason"]
    assert reason.startswith("routed to kube-h100"), reason
    for name in ("slurm-22", "slurm-24", "slurm-26", "kube-a100"):
        assert f"{name}: cannot run this job (no h100 GPUs" in reason, reason

    placed = [get(gw, j) for j in on_slurm]
    assert all(j["assigned_pool"] in SLURM for j in placed), [(j["assigned_pool"], j["routing_reason"]) for j in placed]
    for j in placed:
        for name in ("kube-a100", "kube-h100"):
            assert f"{name}: cannot run this job (a kubernetes pool; the job asks for slurm)" in j["routing_reason"]

    big = get(gw, big_kube)
    assert big["assigned_pool"] == "kube-a100", big
    assert "kube-h100: cannot run this job" in big["routing_reason"], big["routing_reason"]

    done = finish(gw, h100, *on_slurm, big_kube)
    assert {j["state"] for j in done.values()} == {"succeeded"}, done
    verify_ledger(gw)


def test_routing_by_cost_then_an_admin_weight(pg_url, dev_key_path, five_pools, tmp_path):
    """All five idle and fitting: the cheapest pool wins and the reason names all five; an
    admin's weight then outweighs the cost term."""
    cheap = [dict(p, cost=0.5) if p["name"] == "slurm-26" else p for p in five_pools]
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": cheap}, sort_keys=False))
    with five_gateway(pg_url, dev_key_path, path) as gw:
        listed = {p["name"]: p for p in gw.client.get("/v1/pools", headers=gw.headers()).json()["items"]}
        assert listed["slurm-26"]["cost"] == 0.5 and listed["kube-h100"]["cost"] == 2.0
        first = submit(gw)
        gw.app.state.dispatcher.run_once()
        job = get(gw, first)
        assert job["assigned_pool"] == "slurm-26", job["routing_reason"]
        assert job["routing_reason"].startswith("routed to slurm-26"), job["routing_reason"]
        assert all(name in job["routing_reason"] for name in FIVE), job["routing_reason"]

        r = gw.client.patch("/v1/admin/pools/kube-a100", json={"weight": 5.0}, headers=gw.admin)
        assert r.status_code == 200 and r.json()["weight"] == 5.0, r.text
        second = submit(gw)
        gw.app.state.dispatcher.run_once()
        job = get(gw, second)
        assert job["assigned_pool"] == "kube-a100", job["routing_reason"]
        finish(gw, first, second)
        verify_ledger(gw)


# ------------------------------------------------------------------ 2. one account's limits over five pools


def test_concurrent_gpu_quota_holds_across_all_five_pools(gw):
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus": 40}, headers=gw.admin)
    assert r.status_code == 200, r.text
    spread = [submit(gw, pool=name, seconds=4) for name in FIVE]  # 5 x 8 = 40 GPUs
    over = submit(gw, seconds=1)
    gw.app.state.dispatcher.run_once()

    jobs = [get(gw, j) for j in spread]
    assert [j["assigned_pool"] for j in jobs] == list(FIVE), [(j["state"], j["state_reason"]) for j in jobs]
    waiting = get(gw, over)
    assert waiting["state"] == "pending" and waiting["assigned_pool"] is None, waiting
    assert "team-a: 40 of 40 concurrent GPUs in use, job needs 8" in waiting["state_reason"], waiting["state_reason"]

    done = finish(gw, *spread, over)
    assert {j["state"] for j in done.values()} == {"succeeded"}, done
    usage = gw.client.get("/v1/accounts/team-a/usage", headers=user(gw, "team-a")).json()
    assert usage["balance"]["reserved_gpus"] == 0, usage["balance"]
    verify_ledger(gw)


def test_gpu_hour_budget_holds_across_pools_at_their_cost(gw):
    """8 GPUs x 1 min commits 0.133 GPU-hours on a cost-1 pool and 0.267 on kube-h100 (cost 2):
    three jobs commit 0.533 of a 0.6 GPU-hour budget, the fourth waits until they are charged."""
    r = gw.client.put("/v1/admin/accounts/team-b/quota", json={"budget_gpu_hours": 0.6, "budget_period": "month"},
                      headers=gw.admin)
    assert r.status_code == 200, r.text
    first = [submit(gw, "team-b", pool=name, time_limit="1m") for name in ("slurm-22", "kube-h100", "slurm-24")]
    last = submit(gw, "team-b", pool="kube-a100", time_limit="1m")
    gw.app.state.dispatcher.run_once()

    assert all(get(gw, j)["assigned_pool"] for j in first), [get(gw, j)["state_reason"] for j in first]
    waiting = get(gw, last)
    assert waiting["state"] == "pending", waiting
    assert "team-b: GPU-hour budget" in waiting["state_reason"] and "of 0.6 GPU-hours" in waiting["state_reason"], \
        waiting["state_reason"]

    done = finish(gw, *first, last)
    assert {j["state"] for j in done.values()} == {"succeeded"}, done
    assert done[last]["assigned_pool"] == "kube-a100"
    usage = gw.client.get("/v1/accounts/team-b/usage", headers=user(gw, "team-b")).json()
    assert 0 < usage["used_gpu_hours"] <= 0.6 and usage["committed_gpu_hours"] == 0, usage
    verify_ledger(gw)


# ------------------------------------------------------------------ 3. draining


def test_draining_a_pool_lets_its_job_finish_and_sends_nothing_new_there(gw):
    running = submit(gw, pool="slurm-24", seconds=6)
    drive_until(gw, lambda: job_state(gw, running, "running"), timeout_s=60)

    r = gw.client.patch("/v1/admin/pools/slurm-24", json={"state": "draining"}, headers=gw.admin)
    assert r.status_code == 200 and r.json()["state"] == "draining", r.text
    pools = {p["name"]: p for p in gw.client.get("/v1/pools", headers=gw.headers()).json()["items"]}
    assert pools["slurm-24"]["state"] == "draining"

    elsewhere = submit(gw, pool_kind="slurm")
    pinned = submit(gw, pool="slurm-24")
    gw.app.state.dispatcher.run_once()
    moved = get(gw, elsewhere)
    assert moved["assigned_pool"] in ("slurm-22", "slurm-26"), moved["routing_reason"]
    assert "slurm-24: draining" in moved["routing_reason"], moved["routing_reason"]

    done = finish(gw, running, elsewhere)
    assert done[running]["state"] == "succeeded" and done[running]["assigned_pool"] == "slurm-24", done[running]
    assert done[elsewhere]["state"] == "succeeded"
    held = get(gw, pinned)
    assert held["state"] == "pending" and held["assigned_pool"] is None, held
    assert "slurm-24" in held["state_reason"] and "draining" in held["state_reason"], held["state_reason"]

    # back in service: the pinned job goes there
    r = gw.client.patch("/v1/admin/pools/slurm-24", json={"state": "active"}, headers=gw.admin)
    assert r.status_code == 200, r.text
    done = finish(gw, pinned)
    assert done[pinned]["state"] == "succeeded" and done[pinned]["assigned_pool"] == "slurm-24", done[pinned]
    verify_ledger(gw)
