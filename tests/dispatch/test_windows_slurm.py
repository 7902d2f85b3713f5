"""Maintenance windows through the gateway on two real Slurm clusters (issue #31, docs/planning.md).

Both kinds of window, on Slurm 22.05 (host) and 24.11 (chroot), each a 4-node partition:

* one an admin makes through ``POST /v1/admin/pools/{name}/windows`` (the cluster knows
  nothing of it: the gateway alone keeps jobs off it);
* a real Slurm reservation with the MAINT flag made with ``scontrol``, as an operator would
  (the gateway reads it from the cluster).

In each: a job whose time limit would cross the window waits with the window in its reason
and an estimate at the window's end; a job short enough to end before it runs now (backfill);
while a window is under way nothing of the gateway's starts on the pool, and once it is
gone the waiting job runs.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gateway.kit.timeutil import as_utc
from tests import slurm_cli
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    slurm_env,
    wired_gateway,
)

pytestmark = pytest.mark.slurm
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def database_url(postgres_database_url):
    """Postgres only: the round's wiring runs on both databases in tests/dispatch/test_plan_round.py."""
    return postgres_database_url


@pytest.fixture(scope="module", params=["22.05", "24.11"])
def cluster(request) -> dict[str, str]:
    return slurm_env(request.param)


@pytest.fixture
def gw(database_url, dev_key_path, cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(cluster)},
                       scheduling_policy="reservation") as gw:
        yield gw


def scontrol(env: dict[str, str], *args: str) -> str:
    """scontrol on the test cluster as its operator (root) would run it (tests/slurm_cli.py)."""
    return slurm_cli.run(env, "scontrol", *args).stdout


def submit(gw, limit: str, name: str = "maint") -> str:
    body = {"name": name, "account": "team-a", "backend": "slurm", "workers": 1, "gpus_per_worker": 8,
            "time_limit": limit, "command": ["sleep", "1"]}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def get(gw, job_id: str) -> dict:
    return gw.client.get(f"/v1/jobs/{job_id}", headers=gw.headers(admin=True, user="root", groups=())).json()


def idle_pool(gw):
    """Wait until every node of the partition is idle (earlier tests' jobs may still be ending)."""
    def empty():
        v = gw.app.state.dispatcher.views(fresh=True)["slurm"]
        return v if v.total_nodes and v.idle_nodes == v.total_nodes else None
    return drive_until(gw, empty, timeout_s=120, interval_s=1)


def assert_waits_for_the_window(gw, job_id: str, words: str, end: datetime, limit_words: str) -> None:
    job = get(gw, job_id)
    assert job["state"] == "pending", job
    reason = job["state_reason"]
    assert words in reason and f"this job's {limit_words} limit would cross it" in reason, reason
    assert job["estimated_pool"] == "slurm", job
    assert abs((as_utc(datetime.fromisoformat(job["estimated_start"])) - end).total_seconds()) < 2, job


def test_an_admins_window_holds_long_jobs_backfills_short_ones_and_runs_nothing_while_under_way(gw):
    idle_pool(gw)
    admin = gw.headers("root", admin=True)
    now = datetime.now(UTC)
    start, end = now + timedelta(minutes=10), now + timedelta(minutes=70)
    r = gw.client.post("/v1/admin/pools/slurm/windows", headers=admin,
                       json={"start": start.isoformat(), "end": end.isoformat(), "reason": "kernel upgrade"})
    assert r.status_code == 201, r.text
    long_ = submit(gw, "1h", "long")
    short = submit(gw, "5m", "short")
    gw.app.state.dispatcher.run_once()
    assert_waits_for_the_window(gw, long_, "slurm is in maintenance from", end, "1 h")
    assert "(kernel upgrade)" in get(gw, long_)["state_reason"]
    done = drive_until(gw, lambda: job_state(gw, short, *FINAL), timeout_s=90)
    assert done["state"] == "succeeded" and done["backend_job_id"], done  # it ran on the cluster
    assert get(gw, long_)["state"] == "pending"

    # Under way now: not even the short job starts, on any node of the pool.
    assert gw.client.delete(f"/v1/admin/pools/slurm/windows/{r.json()['id']}", headers=admin).status_code == 204
    now = datetime.now(UTC)
    under_way = gw.client.post("/v1/admin/pools/slurm/windows", headers=admin,
                               json={"start": (now - timedelta(minutes=1)).isoformat(),
                                     "end": (now + timedelta(minutes=30)).isoformat(), "reason": "firmware"}).json()
    second = submit(gw, "5m", "during")
    for _ in range(3):
        gw.app.state.dispatcher.run_once()
    assert_waits_for_the_window(gw, second, "slurm is in maintenance from", datetime.fromisoformat(under_way["end"]),
                                "5 min")
    assert get(gw, second)["backend_job_id"] is None
    # The window is gone: both jobs run.
    gw.client.delete(f"/v1/admin/pools/slurm/windows/{under_way['id']}", headers=admin)
    for job_id in (second, long_):
        done = drive_until(gw, lambda job_id=job_id: job_state(gw, job_id, *FINAL), timeout_s=90)
        assert done["state"] == "succeeded", done


def test_a_slurm_maint_reservation_is_honoured_like_the_gateways_own(gw, cluster):
    idle_pool(gw)
    name = f"isthmus-maint-{uuid.uuid4().hex[:8]}"
    partition = cluster["SLURM_PARTITION"]
    scontrol(cluster, "create", "reservation", f"ReservationName={name}", "StartTime=now+10minutes",
             "Duration=60", f"PartitionName={partition}", "Nodes=ALL", "Users=root", "Flags=MAINT")
    try:
        def listed():  # the adapter reads reservations at most every 15 s (adapters/slurm/backend.py)
            rows = gw.client.get("/v1/admin/pools/slurm/windows", headers=gw.headers("root", admin=True)).json()
            return [w for w in rows if w["id"] == name]

        [window] = drive_until(gw, listed, timeout_s=40, interval_s=1)
        assert window["source"] == "slurm" and window["maintenance"] and not window["active"], window
        end = as_utc(datetime.fromisoformat(window["end"]))
        assert abs((end - datetime.now(UTC)) - timedelta(minutes=70)).total_seconds() < 90, window
        long_ = submit(gw, "1h", "long")
        short = submit(gw, "5m", "short")
        gw.app.state.dispatcher.run_once()
        assert_waits_for_the_window(gw, long_, "is in maintenance from", end, "1 h")
        assert name in get(gw, long_)["state_reason"]
        done = drive_until(gw, lambda: job_state(gw, short, *FINAL), timeout_s=90)
        assert done["state"] == "succeeded", done
        # Under way now (the operator moves it to start now): Slurm's nodes are no longer idle
        # and the gateway starts nothing there until the reservation is gone.
        scontrol(cluster, "update", f"ReservationName={name}", "StartTime=now", "Duration=30")
        second = submit(gw, "5m", "during")
        # The adapter reads reservations at most every 15 s (adapters/slurm/backend.py): until
        # then the nodes are simply not idle. Either way nothing starts.
        job = drive_until(gw, lambda: (lambda j: j if name in j["state_reason"] else None)(get(gw, second)),
                          timeout_s=40, interval_s=1)
        assert job["state"] == "pending" and job["backend_job_id"] is None, job
        assert "is in maintenance from" in job["state_reason"] and "5 min limit would cross it" in job["state_reason"]
    finally:
        scontrol(cluster, "delete", f"ReservationName={name}")
    for job_id in (second, long_):
        done = drive_until(gw, lambda job_id=job_id: job_state(gw, job_id, *FINAL), timeout_s=90)
        assert done["state"] == "succeeded", done
