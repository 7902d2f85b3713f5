"""End to end on the real control plane: POST /v1/jobs -> suspended Job -> Kueue admission -> kwok pods -> final state."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.models.ledger import LedgerEntry
from tests.dispatch.conftest import (
    KWOK_EXIT_CODE,
    KWOK_RUN_FOR,
    drive_until,
    job_state,
    kube_backend_options,
    wired_gateway,
)

pytestmark = [pytest.mark.kubernetes, pytest.mark.both_databases]
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def gw(database_url, dev_key_path, kube):
    with wired_gateway(database_url, dev_key_path, {"kubernetes": kube_backend_options(kube)}) as gw:
        yield gw


def submit(gw, **spec):
    body = {"name": "e2e", "account": "team-a", "backend": "kubernetes", "workers": 2, "gpus_per_worker": 4,
            "command": ["python", "train.py"], "image": "registry.example/trainer:1", "time_limit": "10m", **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_job_is_admitted_runs_on_kwok_and_reports_final_state(gw):
    ok = submit(gw, labels={KWOK_RUN_FOR: "4s"})
    bad = submit(gw, labels={KWOK_RUN_FOR: "2s", KWOK_EXIT_CODE: "3"})
    drive_until(gw, lambda: all(job_state(gw, j, *FINAL) for j in (ok, bad)), timeout_s=120)
    h = gw.headers("alice", ("team-a",))
    good = gw.client.get(f"/v1/jobs/{ok}", headers=h).json()
    assert good["state"] == "succeeded", good
    assert good["assigned_backend"] == "kubernetes" and good["backend_job_id"]
    assert good["started_at"] and good["ended_at"] and good["ended_at"] >= good["started_at"]
    states = [e["to_state"] for e in gw.client.get(f"/v1/jobs/{ok}/events", headers=h).json()["items"]
              if e["kind"] == "state"]
    assert states[:3] == ["pending", "dispatching", "queued"] and states[-1] == "succeeded"
    assert "running" in states

    failed = gw.client.get(f"/v1/jobs/{bad}", headers=h).json()
    assert failed["state"] == "failed" and failed["exit_code"] == 3, failed
    with gw.session() as s:
        kinds = [e.kind for e in s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == ok))]
    assert kinds.count("reserve") == 1 and "start" in kinds and "usage" in kinds, kinds


def test_cancel_on_kubernetes_removes_the_job(gw):
    job = submit(gw)  # no run-for label: runs until cancelled
    drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=60)
    h = gw.headers("alice", ("team-a",))
    assert gw.client.post(f"/v1/jobs/{job}/cancel", headers=h).json()["state"] == "cancelling"
    final = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=60)
    assert final["state"] == "cancelled"

    # the gang's GPUs go back to the pool at once, not after the cancelled Job is purged
    def freed():
        view = gw.app.state.dispatcher.views(fresh=True)["kubernetes"]
        return view.free_gpus == view.total_gpus
    drive_until(gw, freed, timeout_s=30)
    assert gw.app.state.backends["kubernetes"].find_by_gateway_id(job) is None or \
        gw.app.state.backends["kubernetes"].find_by_gateway_id(job).state.value == "cancelled"


def test_a_spoofed_job_in_another_namespace_is_ignored(gw):
    """Someone who may create Jobs in another team's namespace copies the victim's gateway id
    onto a 1 s Job of their own (issue #12, finding 1). The reconciler's listing no longer
    takes it for the victim: the victim's gang stays running, held and unbilled by it."""
    import time

    from adapters.base import SubmitRequest
    from adapters.kubernetes.render import render_job

    victim = submit(gw)  # no run-for label: runs until cancelled
    dispatcher = gw.app.state.dispatcher
    dispatcher.reconciler.LIST_THRESHOLD = 0  # follow through one listing, as with more than 5 jobs
    running = drive_until(gw, lambda: job_state(gw, victim, "running"), timeout_s=60)
    backend = gw.app.state.backends["kubernetes"]
    body = render_job(SubmitRequest(gateway_job_id=victim, name="spoof", account="team-b", user="bob",
                                    command=["true"], workers=1, gpus_per_worker=0, cpus_per_worker=1,
                                    memory_mib_per_worker=64, time_limit_s=60, labels={KWOK_RUN_FOR: "1s"}),
                      backend.settings)
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    api = backend._connect()
    api.batch.create_namespaced_job(ns, body)
    try:
        deadline = time.monotonic() + 60
        while not backend.status(f"{ns}/{name}").state.final:
            assert time.monotonic() < deadline, backend.status(f"{ns}/{name}")
            time.sleep(0.5)
        assert backend.status(f"{ns}/{name}").gateway_job_id == victim
        for _ in range(3):
            dispatcher.run_once()
        h = gw.headers("alice", ("team-a",))
        job = gw.client.get(f"/v1/jobs/{victim}", headers=h).json()
        assert job["state"] == "running" and job["backend_job_id"] == running["backend_job_id"], job
        with gw.session() as s:
            from gateway.ledger import reading as ledger_reading
            from gateway.ledger import rules as ledger_rules

            assert ledger_rules.charged_gpu_seconds(s, job_id=victim) == 0
            assert ledger_reading.get_balance(s, "team-a").reserved_gpus == 8
            assert ledger_reading.verify(s) == []
        # adoption looks only at the deterministic name in the account's namespace
        found = backend.find_by_gateway_id(victim, request=SubmitRequest(
            gateway_job_id=victim, name="e2e", account="team-a", user="alice", command=["x"], workers=2,
            gpus_per_worker=4, cpus_per_worker=1, memory_mib_per_worker=64, time_limit_s=600))
        assert found is not None and found.backend_job_id == running["backend_job_id"]
        assert gw.client.post(f"/v1/jobs/{victim}/cancel", headers=h).json()["state"] == "cancelling"
        assert drive_until(gw, lambda: job_state(gw, victim, *FINAL), timeout_s=60)["state"] == "cancelled"
    finally:
        api.batch.delete_namespaced_job(name, ns, propagation_policy="Background")
