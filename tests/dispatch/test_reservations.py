"""Reservations with conservative backfill, through the gateway, on the real Slurm 25.11 cluster
and the real Kueue pool (issue #15).

Each pool has 4 nodes of 8 GPUs. team-a and team-b start with equal shares and no usage,
so team-a is first in fair share (then by name), and stays first while team-b's jobs run
and are charged.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from gateway.kit.timeutil import as_utc
from tests.dispatch.conftest import (
    KWOK_RUN_FOR,
    drive_until,
    job_state,
    kube_backend_options,
    slurm_backend_options,
    wired_gateway,
)

pytestmark = pytest.mark.slurm("25.11")  # off 22.05, the busiest lane
FINAL = ("succeeded", "failed", "cancelled")
USERS = {"team-a": "alice", "team-b": "bob"}


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)},
                       scheduling_policy="reservation") as gw:
        yield gw


@pytest.fixture
def kube_gw(database_url, dev_key_path, kube):
    with wired_gateway(database_url, dev_key_path, {"kubernetes": kube_backend_options(kube)},
                                     scheduling_policy="reservation") as gw:
        yield gw


def submit(gw, account: str, pool: str = "slurm", run_s: int = 5, **spec) -> str:
    body = {"name": "resv", "account": account, "backend": pool, "workers": 1, "gpus_per_worker": 8,
            "time_limit": "1m", **spec}
    if pool == "slurm":
        body.setdefault("command", ["sleep", str(run_s)])
    else:  # kwok runs no containers: the label says how long the pods "run"
        body.setdefault("command", ["python", "train.py"])
        body["labels"] = {KWOK_RUN_FOR: f"{run_s}s"}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers(USERS[account], (account,)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def get(gw, job_id: str) -> dict:
    return gw.client.get(f"/v1/jobs/{job_id}", headers=gw.headers(admin=True, user="root", groups=())).json()


def at(value: str) -> datetime:
    return as_utc(datetime.fromisoformat(value))


def starvation(gw, pool: str) -> None:
    """One account keeps the pool busy with 1-node jobs (9-14 s, 2 min limit) and always has
    three more pending; the top fair-share account submits one whole-pool gang.

    The gang must start once the jobs running at its submission have ended, and no stream job
    may start in between: each would end (by its limit) after the gang's planned start, so
    starting one would delay the gang's reservation. A greedy pick starts one every time a
    node frees, and the gang never starts while the stream flows.
    """
    # The scenario's premise: the stream is the only load. Capacity held by something the
    # gateway did not submit (an earlier test's workloads still being torn down) has no known
    # end, so no reservation can be planned against it (docs/dispatch.md): wait for the pool to
    # be empty first, and say what holds it if it never gets there.
    def empty():
        v = gw.app.state.dispatcher.views(fresh=True)[pool]
        free, total = (v.idle_nodes, v.total_nodes) if v.node_exclusive else (v.free_gpus, v.total_gpus)
        return v if total and free == total else None

    try:
        view = drive_until(gw, empty, timeout_s=180, interval_s=1)
    except AssertionError:
        raise AssertionError(f"{pool} never emptied before the scenario: "
                             f"{gw.app.state.dispatcher.views(fresh=True)[pool]}") from None
    slots = view.total_nodes if view.node_exclusive else view.total_gpus // 8
    assert slots >= 2, view
    stream: list[str] = []

    def more() -> None:
        stream.append(submit(gw, "team-b", pool, run_s=9 + len(stream) % 6, time_limit="2m"))

    def top_up() -> None:
        pending = sum(1 for j in stream if get(gw, j)["state"] == "pending")
        for _ in range(3 - pending):
            more()

    story: list[str] = []  # what the gang and the stream looked like, for a failure's message
    try:
        for _ in range(slots):
            more()
        top_up()
        drive_until(gw, lambda: sum(get(gw, j)["state"] == "running" for j in stream) >= slots, timeout_s=90)

        gang = submit(gw, "team-a", pool, run_s=3, workers=slots)
        submitted = time.monotonic()
        gw.app.state.dispatcher.run_once()
        waiting = get(gw, gang)
        assert waiting["state"] == "pending", waiting
        # An estimate, like squeue --start: when the running jobs reach their time limits.
        assert waiting["estimated_pool"] == pool and waiting["estimated_start"], waiting
        estimate = at(waiting["estimated_start"])
        assert f"reserved on {pool}" in waiting["state_reason"], waiting["state_reason"]

        def gang_started():
            top_up()
            job = get(gw, gang)
            states = [get(gw, j)["state"] for j in stream]
            line = (f"{time.monotonic() - submitted:5.1f}s gang={job['state']} "
                    f"stream={ {s: states.count(s) for s in sorted(set(states))} } "
                    f"pool={gw.app.state.dispatcher.latest_views()[pool].describe()!r} reason={job['state_reason']!r}")
            if not story or story[-1].split(" ", 1)[1] != line.split(" ", 1)[1]:
                story.append(line)
            return job if job["started_at"] or job["state"] in ("running", *FINAL) else None

        started = drive_until(gw, gang_started, timeout_s=100, interval_s=0.5)
        waited = time.monotonic() - submitted
        # The stream never stopped: team-b still had jobs waiting when the gang started ...
        assert sum(get(gw, j)["state"] == "pending" for j in stream) >= 1
        # ... and no stream job started between the gang's submission and its start: the gang
        # went as soon as the jobs running at its submission had ended (<= 14 s each, plus the
        # pool's own latency), not when the stream dried up (a greedy pick: never, here).
        # Backend start times are whole seconds: a job started after the gang is never earlier.
        gang_start = at(started["started_at"])
        overtook = [(j, s) for j in stream if (s := get(gw, j)["started_at"]) and at(s) > at(started["created_at"])
                    and at(s) < gang_start]
        assert not overtook, (f"stream jobs started after the gang was submitted and before it started "
                              f"({waited:.0f} s): {overtook}")
        # The estimate is never earlier than the real start (backend times are whole seconds).
        assert (at(started["started_at"]) - estimate).total_seconds() < 1, (started["started_at"], estimate)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(story)) from None
    done = drive_until(gw, lambda: job_state(gw, gang, *FINAL), timeout_s=60)
    assert done["state"] == "succeeded", done


def test_slurm_a_whole_pool_gang_starts_once_the_running_jobs_end_not_when_the_stream_stops(gw):
    starvation(gw, "slurm")


@pytest.mark.kubernetes
def test_kueue_a_whole_pool_gang_starts_once_the_running_jobs_end_not_when_the_stream_stops(kube_gw):
    starvation(kube_gw, "kubernetes")


def test_backfill_a_short_job_that_ends_before_the_reservation_starts_now_a_long_one_waits(gw):
    nodes = gw.app.state.dispatcher.views(fresh=True)["slurm"].total_nodes
    # One node busy for up to 3 minutes: the whole-pool gang's reservation is that far out.
    blocker = submit(gw, "team-b", time_limit="3m", run_s=170)
    drive_until(gw, lambda: job_state(gw, blocker, "running"), timeout_s=60)
    gang = submit(gw, "team-a", workers=nodes, run_s=2)
    gw.app.state.dispatcher.run_once()
    assert get(gw, gang)["estimated_start"], get(gw, gang)
    short = submit(gw, "team-b", time_limit="1m", run_s=2)  # ends before the planned start
    long = submit(gw, "team-b", time_limit="10m", run_s=2)  # would delay the gang
    ran_short = drive_until(gw, lambda: job_state(gw, short, "running", *FINAL), timeout_s=30)
    assert ran_short["state"] in ("running", "succeeded"), ran_short
    gw.app.state.dispatcher.run_once()
    held = get(gw, long)
    assert held["state"] == "pending", held
    assert held["estimated_start"] and at(held["estimated_start"]) >= at(get(gw, gang)["estimated_start"]), held
    # The blocker ends (cancelled here to keep the test short): the gang starts, then the long job.
    gw.client.post(f"/v1/jobs/{blocker}/cancel", headers=gw.headers("bob", ("team-b",)))
    gang_run = drive_until(gw, lambda: job_state(gw, gang, "running", *FINAL), timeout_s=60)
    after = get(gw, long)
    assert after["state"] in ("pending", "dispatching", "queued") or (
        after["started_at"] and at(after["started_at"]) >= at(gang_run["started_at"])), (after, gang_run)


def test_another_accounts_job_is_dispatched_past_hundreds_of_unadmittable_ones(gw):
    admin = gw.headers(admin=True, user="root", groups=())
    # team-b first in fair share, with room for one 8-GPU job at a time.
    r = gw.client.patch("/v1/admin/accounts/team-b", json={"shares": 100}, headers=admin)
    assert r.status_code == 200, r.text
    r = gw.client.put("/v1/admin/accounts/team-b/quota", json={"max_gpus": 8}, headers=admin)
    assert r.status_code == 200, r.text
    first = submit(gw, "team-b", time_limit="2m", run_s=60)
    drive_until(gw, lambda: job_state(gw, first, "running", "queued", "starting"), timeout_s=60)
    for _ in range(150):  # more than a dispatch batch, none admissible while `first` runs
        submit(gw, "team-b", run_s=1)
    other = submit(gw, "team-a", run_s=1)
    gw.app.state.dispatcher.run_once()
    assert get(gw, other)["state"] != "pending", get(gw, other)
