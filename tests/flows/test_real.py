"""Workflows on the real pools: Slurm 26.05 and Kueue (kwok), driven round by round (issue #16).

Run under the cluster lock: flock /work/cluster.lock .venv/bin/pytest tests/flows/test_real.py
"""

from __future__ import annotations

import itertools
from datetime import datetime

import pytest
from sqlalchemy import func, select

from gateway.models.jobs import Job, JobEvent
from gateway.models.ledger import LedgerEntry, Reservation
from tests.dispatch.conftest import (
    KWOK_RUN_FOR,
    drive_until,
    kube_backend_options,
    slurm_backend_options,
    wired_gateway,
)

pytestmark = [pytest.mark.slurm("26.05"), pytest.mark.kubernetes]  # off 22.05, the busiest lane
FINAL = {"succeeded", "failed", "cancelled"}
HOLDING = ("dispatching", "queued", "starting", "running", "requeued", "cancelling")


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster, kube):
    backends = {"slurm": slurm_backend_options(slurm_cluster), "kubernetes": kube_backend_options(kube)}
    with wired_gateway(database_url, dev_key_path, backends, max_pending_jobs_per_user=5000) as gw:
        yield gw


def post(gw, path, body):
    r = gw.client.post(path, json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    return r.json()


def job(gw, job_id):
    return gw.client.get(f"/v1/jobs/{job_id}", headers=gw.headers("alice", ("team-a",))).json()


def tasks(gw, set_id):
    return gw.client.get(f"/v1/job-sets/{set_id}/tasks?limit=1000", headers=gw.headers("alice", ("team-a",))
                         ).json()["items"]


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def step(name, backend, command, **kw):
    spec = {"name": name, "account": "team-a", "backend": backend, "command": command, "gpus_per_worker": 1,
            "time_limit": "5m", **kw}
    if backend == "kubernetes":
        spec["labels"] = {KWOK_RUN_FOR: "2s"}
    return spec


def test_pipeline_slurm_then_kueue_then_slurm_runs_in_order(gw):
    pre = post(gw, "/v1/jobs", step("preprocess", "slurm", ["sleep", "1"]))
    train = post(gw, "/v1/jobs", step("train", "kubernetes", ["sleep", "2"], depends_on=[{"job": pre["id"]}]))
    evaluate = post(gw, "/v1/jobs", step("evaluate", "slurm", ["true"], depends_on=[{"job": train["id"]}]))
    assert (train["state"], evaluate["state"]) == ("blocked", "blocked")
    ids = [pre["id"], train["id"], evaluate["id"]]
    drive_until(gw, lambda: all(job(gw, i)["state"] in FINAL for i in ids), timeout_s=180)
    done = [job(gw, i) for i in ids]
    assert [j["state"] for j in done] == ["succeeded"] * 3, [(j["state"], j["state_reason"]) for j in done]
    assert [j["assigned_backend"] for j in done] == ["slurm", "kubernetes", "slurm"]
    # each step was released (blocked -> pending) only after the one before it ended
    for before, after in itertools.pairwise(done):
        events = gw.client.get(f"/v1/jobs/{after['id']}/events", headers=gw.headers("alice", ("team-a",))).json()
        released = next(e for e in events["items"] if e["from_state"] == "blocked" and e["to_state"] == "pending")
        assert at(released["at"]) >= at(before["ended_at"])
        assert at(after["started_at"]) >= at(before["ended_at"])


def test_failure_in_step_one_cancels_steps_two_and_three_with_the_reason(gw):
    pre = post(gw, "/v1/jobs", step("preprocess", "slurm", ["false"]))
    train = post(gw, "/v1/jobs", step("train", "kubernetes", ["true"], depends_on=[{"job": pre["id"]}]))
    evaluate = post(gw, "/v1/jobs", step("evaluate", "slurm", ["true"], depends_on=[{"job": train["id"]}]))
    drive_until(gw, lambda: job(gw, evaluate["id"])["state"] in FINAL, timeout_s=120)
    assert job(gw, pre["id"])["state"] == "failed"
    got_train, got_eval = job(gw, train["id"]), job(gw, evaluate["id"])
    assert got_train["state"] == "cancelled" and got_eval["state"] == "cancelled"
    assert got_train["state_reason"] == f"cancelled: dependency job {pre['id']} can no longer be succeeded"
    assert got_eval["state_reason"] == f"cancelled: dependency job {train['id']} can no longer be succeeded"
    assert got_train["backend_job_id"] is None and got_eval["backend_job_id"] is None  # never sent anywhere
    with gw.session() as s:
        assert s.scalar(select(func.count()).select_from(Reservation).where(
            Reservation.job_id.in_([train["id"], evaluate["id"]]))) == 0


def _max_overlap(gw, set_id) -> int:
    """The most tasks of the set that held a slot at once, from their recorded history."""
    with gw.session() as s:
        ids = list(s.scalars(select(Job.id).where(Job.job_set_id == set_id)))
        points = []
        for job_id in ids:
            events = list(s.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "state")
                                    .order_by(JobEvent.id)))
            start = next(e.id for e in events if e.to_state == "dispatching")
            end = next(e.id for e in events if e.to_state in FINAL)
            points += [(start, 1), (end, -1)]
    live = peak = 0
    for _, delta in sorted(points):  # event ids are the order the gateway recorded them in
        live += delta
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("backend", ["slurm", "kubernetes"])
def test_array_with_max_running_2_never_has_more_than_2_running(gw, backend):
    js = post(gw, "/v1/job-sets", {**step("arr", backend, ["sleep", "1"]), "array": {"count": 6, "max_running": 2}})
    assert js["counts"] == {"pending": 2, "blocked": 4}
    seen = []

    def observe():
        with gw.session() as s:
            seen.append(s.scalar(select(func.count()).select_from(Job).where(
                Job.job_set_id == js["id"], Job.state.in_(HOLDING))))
            return s.scalar(select(func.count()).select_from(Job).where(
                Job.job_set_id == js["id"], Job.state.in_(FINAL))) == 6
    drive_until(gw, observe, timeout_s=240, interval_s=0.2)
    assert max(seen) <= 2 and max(seen) >= 1, seen
    assert _max_overlap(gw, js["id"]) <= 2
    assert [t["state"] for t in tasks(gw, js["id"])] == ["succeeded"] * 6


def test_sweep_of_200_points_each_task_gets_its_parameters_and_is_charged(gw):
    body = {**step("sweep", "kubernetes", ["python", "train.py", "--lr", "{{ lr }}", "--seed", "{{ seed }}"]),
            "env": {"LR": "{{ lr }}"}, "sweep": {"lr": [f"1e-{i}" for i in range(1, 21)], "seed": list(range(10))}}
    body["labels"] = {KWOK_RUN_FOR: "1s"}
    js = post(gw, "/v1/job-sets", body)
    assert js["task_count"] == 200
    drive_until(gw, lambda: sum(n for s, n in gw.client.get(
        f"/v1/job-sets/{js['id']}", headers=gw.headers("alice", ("team-a",))).json()["counts"].items()
        if s in FINAL) == 200, timeout_s=240)
    got = tasks(gw, js["id"])
    assert {t["state"] for t in got} == {"succeeded"}
    pairs = set()
    for t in got:
        lr, seed = t["parameters"]["lr"], t["parameters"]["seed"]
        pairs.add((lr, seed))
        assert t["command"] == ["python", "train.py", "--lr", lr, "--seed", seed]
        assert t["env"]["LR"] == lr and t["env"]["ISTHMUS_ARRAY_COUNT"] == "200"
    assert len(pairs) == 200
    with gw.session() as s:
        ids = [t["id"] for t in got]
        assert s.scalar(select(func.count()).select_from(Reservation).where(
            Reservation.job_id.in_(ids), Reservation.status == "finished")) == 200
        charged = set(s.scalars(select(LedgerEntry.job_id).where(LedgerEntry.job_id.in_(ids),
                                                                  LedgerEntry.kind == "usage")))
        assert charged == set(ids)


def test_sweep_on_slurm_each_task_sees_its_own_values(gw, slurm_cluster):
    body = {**step("echo", "slurm", ["sh", "-c", 'echo "lr=$LR idx=$ISTHMUS_ARRAY_INDEX arg=$0"', "{{ lr }}"]),
            "env": {"LR": "{{ lr }}"}, "sweep": {"lr": ["0.1", "0.01; rm -rf /", "$(id)"]}}
    js = post(gw, "/v1/job-sets", body)
    drive_until(gw, lambda: all(t["state"] in FINAL for t in tasks(gw, js["id"])), timeout_s=120)
    for t in tasks(gw, js["id"]):
        assert t["state"] == "succeeded", t["state_reason"]
        lr = t["parameters"]["lr"]
        # the task's own output, as its user reads it (per worker: docs/logs.md)
        r = gw.client.get(f"/v1/jobs/{t['id']}/logs?worker=0", headers=gw.headers("alice", ("team-a",)))
        assert r.status_code == 200, r.text
        out = r.text
        # the value arrives verbatim, as one argument and one variable: no shell ever parsed it
        assert f"lr={lr} idx={t['array_index']} arg={lr}" in out, out
