"""End to end on the real Slurm cluster: POST /v1/jobs -> sbatch -> run -> final state in the registry."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from sqlalchemy import select

from adapters.base import BackendState
from gateway.kit.timeutil import as_utc
from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from gateway.models.ledger import LedgerEntry
from tests import slurm_cli
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    wired_gateway,
)

pytestmark = [pytest.mark.slurm, pytest.mark.both_databases]  # 22.05: the requeue test needs a REST API that lets scontrol requeue
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        yield gw


def submit(gw, **spec):
    body = {"name": "e2e", "account": "team-a", "backend": "slurm", "workers": 1, "gpus_per_worker": 8,
            "time_limit": "5m", **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_job_runs_on_slurm_and_reports_final_state_exit_code_and_times(gw):
    ok = submit(gw, command=["/bin/sh", "-c", "id -un; hostname; sleep 4"], workers=2)
    bad = submit(gw, command=["/bin/sh", "-c", "exit 3"])
    done = drive_until(gw, lambda: all(job_state(gw, j, *FINAL) for j in (ok, bad)), timeout_s=120)
    assert done
    h = gw.headers("alice", ("team-a",))
    good = gw.client.get(f"/v1/jobs/{ok}", headers=h).json()
    assert good["state"] == "succeeded", good
    assert good["assigned_backend"] == "slurm" and good["backend_job_id"]
    assert good["exit_code"] == 0
    assert good["started_at"] and good["ended_at"] and good["ended_at"] >= good["started_at"]
    assert len(good["nodes"]) == 2
    assert "routed to slurm" in good["routing_reason"]

    failed = gw.client.get(f"/v1/jobs/{bad}", headers=h).json()
    assert failed["state"] == "failed" and failed["exit_code"] == 3, failed

    events = gw.client.get(f"/v1/jobs/{ok}/events", headers=h).json()["items"]
    states = [e["to_state"] for e in events if e["kind"] == "state"]
    assert states[:3] == ["pending", "dispatching", "queued"]
    assert "running" in states and states[-1] == "succeeded"
    # the ledger charged real usage and released the rest
    with gw.session() as s:
        kinds = [e.kind for e in s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == ok))]
    assert "reserve" in kinds and "start" in kinds and "usage" in kinds, kinds


def test_cancel_running_job_on_slurm(gw):
    job = submit(gw, command=["sleep", "300"])
    drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=60)
    h = gw.headers("alice", ("team-a",))
    r = gw.client.post(f"/v1/jobs/{job}/cancel", headers=h)
    assert r.status_code == 202 and r.json()["state"] == "cancelling"
    final = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=60)
    assert final["state"] == "cancelled"
    # Killed on cancel: it never exited 0, so it must not say so (issue #14, 8).
    assert final["exit_code"] != 0, final
    assert final["ended_at"] and final["ended_at"] >= final["started_at"]


def test_pinned_job_that_can_never_fit_is_rejected_at_submit(gw):
    gw.app.state.dispatcher.views(fresh=True)  # what a running gateway has after one round
    r = gw.client.post("/v1/jobs", json={"name": "huge", "account": "team-a", "backend": "slurm",
                                         "command": ["true"], "workers": 64, "gpus_per_worker": 8},
                       headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 422, r.text
    assert "never run" in r.json()["detail"] and "nodes" in r.json()["detail"]


def test_orphans_are_reported_to_admins(gw):
    """A Slurm job carrying a gateway id the registry never issued is listed; nothing else is."""
    import uuid

    from adapters.base import SubmitRequest

    backend = gw.app.state.backends["slurm"]
    ghost = f"ghost-{uuid.uuid4().hex[:10]}"
    known = submit(gw, command=["sleep", "60"])
    drive_until(gw, lambda: job_state(gw, known, "queued", "starting", "running"), timeout_s=60)
    result = backend.submit(SubmitRequest(gateway_job_id=ghost, name="ghost", account="team-a", user="alice",
                                          command=["sleep", "60"], workers=1, gpus_per_worker=0, cpus_per_worker=1,
                                          memory_mib_per_worker=1024, time_limit_s=120))
    try:
        assert gw.client.get("/v1/admin/orphans", headers=gw.headers("alice", ("team-a",))).status_code == 403
        r = gw.client.get("/v1/admin/orphans", headers=gw.headers("root", (), admin=True))
        assert r.status_code == 200, r.text
        ids = {o["gateway_job_id"] for o in r.json()}
        assert ghost in ids
        assert known not in ids
        mine = next(o for o in r.json() if o["gateway_job_id"] == ghost)
        assert mine["backend"] == "slurm" and mine["backend_job_id"] == result.backend_job_id
    finally:
        backend.cancel(result.backend_job_id)


def test_submission_wakes_the_dispatcher(database_url, dev_key_path, slurm_cluster):
    """With a 60 s interval, a new job still reaches Slurm within seconds: submit wakes the loop."""
    import time

    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)},
                       dispatch_interval_s=60) as gw:
        gw.app.state.dispatcher.start()
        try:
            time.sleep(1)  # the first round has run; the loop now sleeps for 60 s
            job = submit(gw, command=["true"])
            deadline = time.monotonic() + 15
            while not job_state(gw, job, "queued", "starting", "running", "succeeded"):
                assert time.monotonic() < deadline, "the submission did not wake the dispatcher"
                time.sleep(0.2)
        finally:
            gw.app.state.dispatcher.stop()


def scontrol(env: dict[str, str], *args: str) -> None:
    """Run scontrol on the test cluster the way an operator would (tests/slurm_cli.py)."""
    slurm_cli.run(env, "scontrol", *args)


def test_requeue_on_slurm_charges_each_run_not_the_wait(gw, slurm_cluster):
    """An operator requeues a running job; it waits, runs again, and is cancelled. The
    ledger charges the two runs, never the time the job spent back in Slurm's queue."""
    job = submit(gw, command=["sleep", "300"])
    running = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=60)
    time.sleep(3)
    scontrol(slurm_cluster, "requeue", running["backend_job_id"])
    requeued = drive_until(gw, lambda: job_state(gw, job, "requeued", "queued"), timeout_s=30)
    assert requeued["started_at"] is None, requeued
    time.sleep(5)  # back in the queue: not to be charged
    # Slurm holds a requeued job for about two minutes (BeginTime); let it go now.
    scontrol(slurm_cluster, "update", f"jobid={running['backend_job_id']}", "starttime=now")
    again = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=60)
    assert again["backend_job_id"] == running["backend_job_id"]
    time.sleep(3)
    h = gw.headers("alice", ("team-a",))
    assert gw.client.post(f"/v1/jobs/{job}/cancel", headers=h).json()["state"] == "cancelling"
    done = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=60)
    assert done["state"] == "cancelled"

    events = gw.client.get(f"/v1/jobs/{job}/events", headers=h).json()["items"]
    states = [e["to_state"] for e in events if e["kind"] == "state"]
    assert states.count("running") == 2 and "requeued" in states, states
    with gw.session() as s:
        usage = list(s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job, LedgerEntry.kind == "usage")
                               .order_by(LedgerEntry.id)))
        charged = ledger_rules.charged_gpu_seconds(s, job_id=job)
        assert ledger_reading.verify(s) == []
    assert len(usage) == 2 and usage[0].data["requeued"] is True, [(u.reason, u.data) for u in usage]

    def span(entry, a="started_at", b="ended_at"):
        return (as_utc(datetime.fromisoformat(entry.data[b])) - as_utc(datetime.fromisoformat(entry.data[a])))

    run1, run2 = span(usage[0]).total_seconds(), span(usage[1]).total_seconds()
    waited = (as_utc(datetime.fromisoformat(usage[1].data["started_at"]))
              - as_utc(datetime.fromisoformat(usage[0].data["ended_at"]))).total_seconds()
    assert run1 >= 2 and run2 >= 2 and waited >= 3, (run1, run2, waited)  # Slurm times are whole seconds
    assert abs(charged - 8 * (run1 + run2)) <= 8 * 2, (charged, run1, run2)
    first_to_end = (as_utc(datetime.fromisoformat(done["ended_at"]))
                    - as_utc(datetime.fromisoformat(usage[0].data["started_at"]))).total_seconds()
    assert charged <= 8 * (first_to_end - waited + 2), (charged, first_to_end, waited)


def test_a_running_job_is_charged_while_it_runs_and_the_total_is_its_real_run(database_url, dev_key_path, slurm_cluster):
    """Usage accrual: the account's usage and fair share see a running gang before it ends,
    and the end charges only the rest, so the total is still the real run on the cluster."""
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)},
                       usage_accrual_interval_s=1) as gw:
        h = gw.headers("alice", ("team-a",))
        job = submit(gw, command=["sleep", "8"])
        running = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=60)
        before = gw.client.get("/v1/accounts/team-a/usage", headers=h).json()
        time.sleep(3)
        assert gw.app.state.dispatcher.accrue_round() == 1
        during = gw.client.get("/v1/accounts/team-a/usage", headers=h).json()
        assert job_state(gw, job, "running"), "the job must still be running for this check"
        # 8 GPUs for >= 3 s are visible now: in fair share, and moved out of the commitment
        assert during["fairshare"]["raw_usage_gpu_hours"] - ((before["fairshare"] or {}).get(
            "raw_usage_gpu_hours") or 0) >= 8 * 2 / 3600, (before, during)
        assert during["balance"]["committed_gpu_hours"] <= before["balance"]["committed_gpu_hours"] - 8 * 2 / 3600
        done = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=90)
        assert done["state"] == "succeeded", done
        with gw.session() as s:
            usage = list(s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job, LedgerEntry.kind == "usage")
                                   .order_by(LedgerEntry.id)))
            charged = ledger_rules.charged_gpu_seconds(s, job_id=job)
            assert ledger_reading.verify(s) == []
        assert usage[0].data.get("accrual") is True and len(usage) >= 2, [(u.reason, u.data) for u in usage]
        ran = (as_utc(datetime.fromisoformat(done["ended_at"]))
               - as_utc(datetime.fromisoformat(done["started_at"]))).total_seconds()
        assert abs(charged - 8 * ran) <= 8, (charged, ran)  # Slurm times are whole seconds
        assert running["started_at"] == done["started_at"]


def _ts(value: str) -> datetime:
    return as_utc(datetime.fromisoformat(value))


def test_a_requeue_over_budget_cancels_the_job_and_the_budget_holds(gw, slurm_cluster):
    """The next run of a requeued job is admitted again: with no budget left for it, the job is
    cancelled with the budget's words, on Slurm too, and the account keeps its budget."""
    admin = gw.headers("root", (), admin=True)
    # 8 GPUs x 5 min = 0.667 GPU-hours committed: admitted with a little to spare, not twice
    assert gw.client.put("/v1/admin/accounts/team-a/quota", json={"budget_gpu_hours": 0.67},
                         headers=admin).status_code == 200
    job = submit(gw, command=["sleep", "300"])
    running = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=60)
    time.sleep(3)
    scontrol(slurm_cluster, "requeue", running["backend_job_id"])
    done = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=40)
    assert done["state"] == "cancelled", done
    h = gw.headers("alice", ("team-a",))
    events = gw.client.get(f"/v1/jobs/{job}/events", headers=h).json()["items"]
    states = [e["to_state"] for e in events if e["kind"] == "state"]
    assert states[-3:] == ["requeued", "cancelling", "cancelled"], states
    why = next(e["reason"] for e in events if e.get("to_state") == "cancelling")
    assert why.startswith("cancelled at requeue: over budget: team-a: GPU-hour budget this month"), why
    backend = gw.app.state.backends["slurm"]
    assert backend.status(running["backend_job_id"]).state is BackendState.CANCELLED
    usage = gw.client.get("/v1/accounts/team-a/usage", headers=h).json()
    assert usage["remaining_gpu_hours"] >= 0, usage
    assert usage["balance"]["committed_gpu_hours"] == 0 and usage["balance"]["reserved_gpus"] == 0, usage
    with gw.session() as s:
        charged = ledger_rules.charged_gpu_seconds(s, job_id=job)
        assert ledger_reading.verify(s) == []
    assert 8 * 2 <= charged <= 8 * 30, charged  # the run before the requeue, not the time limit


def test_a_requeue_and_restart_between_two_looks_charges_each_run_to_slurms_times(gw, slurm_cluster):
    """The gateway does not look while Slurm requeues the gang and starts it again. It still
    sees the requeue (Slurm's restart count and requeue time), charges the first run up to
    Slurm's requeue time, not the wait in the queue, and the second run from its own start."""
    job = submit(gw, command=["sleep", "300"])
    running = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=60)
    backend = gw.app.state.backends["slurm"]
    bid = running["backend_job_id"]
    time.sleep(2)
    scontrol(slurm_cluster, "requeue", bid)
    requeued_at = datetime.now().astimezone()
    time.sleep(4)  # in the queue: not to be charged
    scontrol(slurm_cluster, "update", f"jobid={bid}", "starttime=now")
    deadline = time.monotonic() + 60
    while backend.status(bid).state is not BackendState.RUNNING:
        assert time.monotonic() < deadline, backend.status(bid)
        time.sleep(0.5)
    time.sleep(2)
    again = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=10)
    h = gw.headers("alice", ("team-a",))
    events = gw.client.get(f"/v1/jobs/{job}/events", headers=h).json()["items"]
    states = [e["to_state"] for e in events if e["kind"] == "state"]
    assert states[-3:] == ["running", "requeued", "running"], states
    assert _ts(again["started_at"]) > _ts(running["started_at"])
    assert gw.client.post(f"/v1/jobs/{job}/cancel", headers=h).json()["state"] == "cancelling"
    done = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=60)
    with gw.session() as s:
        usage = list(s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job, LedgerEntry.kind == "usage")
                               .order_by(LedgerEntry.id)))
        charged = ledger_rules.charged_gpu_seconds(s, job_id=job)
        assert ledger_reading.verify(s) == []
    first_end = _ts(usage[0].data["ended_at"])
    assert usage[0].data["requeued"] is True
    assert abs((first_end - requeued_at).total_seconds()) <= 2, (first_end, requeued_at)  # Slurm's, not ours
    run1 = (first_end - _ts(running["started_at"])).total_seconds()
    run2 = (_ts(done["ended_at"]) - _ts(again["started_at"])).total_seconds()
    assert abs(charged - 8 * (run1 + run2)) <= 8 * 2, (charged, run1, run2)
    wall = (_ts(done["ended_at"]) - _ts(running["started_at"])).total_seconds()
    assert charged <= 8 * (wall - 3), (charged, wall)  # the >= 4 s in the queue are not charged
