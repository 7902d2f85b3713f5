"""Faults on the real Slurm cluster and a real Postgres: nothing lost, nothing doubled, ledger balanced.

Each test runs gateway worker PROCESSES (``isthmus worker``) against one Postgres
database and kills, restarts or cuts off what a real outage would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from adapters.slurm import SlurmBackend, SlurmSettings
from gateway.models.jobs import Job, JobEvent
from stack.databases import temporary_database
from tests.conftest import REPO, wait_for
from tests.dispatch.conftest import slurm_backend_options, wired_gateway
from tests.e2e.conftest import ISTHMUS

pytestmark = [pytest.mark.slurm("24.11"), pytest.mark.postgres]
FINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def pg_url(own_postgres_server):
    """A database on the module's own server: test_postgres_restart_is_survived restarts it."""
    with temporary_database(own_postgres_server.url, prefix="isthmus_faults", migrated=True) as url:
        yield url


@pytest.fixture
def slurm_backend(slurm_cluster):
    return SlurmBackend(SlurmSettings(**slurm_backend_options(slurm_cluster)))


@pytest.fixture
def gateway(pg_url, dev_key_path, slurm_cluster):
    """API only (no dispatcher in it): jobs are submitted over HTTP, workers dispatch."""
    with wired_gateway(pg_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        yield gw


class Workers:
    def __init__(self, url: str, slurm_env: dict, tmp: Path):
        self.url, self.slurm_env, self.tmp = url, slurm_env, tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, **settings) -> subprocess.Popen:
        env = {**os.environ, "ISTHMUS_DATABASE_URL": self.url,
               "ISTHMUS_BACKENDS": json.dumps({"slurm": slurm_backend_options(self.slurm_env)}),
               "ISTHMUS_DISPATCH_INTERVAL_S": "0.3", "ISTHMUS_DISPATCH_LEASE_S": "4",
               "ISTHMUS_RETRY_BACKOFF_BASE_S": "0.3", "ISTHMUS_RETRY_BACKOFF_MAX_S": "1",
               "ISTHMUS_CAPACITY_TTL_S": "0", "ISTHMUS_LOG_LEVEL": "info"}
        env.update({f"ISTHMUS_{k.upper()}": str(v) for k, v in settings.items()})
        log = (self.tmp / f"worker-{len(self.procs)}.log").open("w")
        path = log.name
        proc = subprocess.Popen([ISTHMUS, "worker"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.procs.append(proc)
        time.sleep(1.0)
        assert proc.poll() is None, f"worker exited at start: {Path(path).read_text()[-3000:]}"
        return proc

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


@pytest.fixture
def workers(pg_url, slurm_cluster, tmp_path):
    w = Workers(pg_url, slurm_cluster, tmp_path)
    yield w
    w.stop_all()


def submit(gw, n=1, command=("true",), workers=1):
    ids = []
    for i in range(n):
        r = gw.client.post("/v1/jobs", json={"name": f"f{i}", "account": "team-a", "backend": "slurm",
                                             "command": list(command), "workers": workers, "gpus_per_worker": 8,
                                             "time_limit": "5m"},
                           headers=gw.headers("alice", ("team-a",)))
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    return ids


def states(url: str, ids: list[str]) -> dict[str, str]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            rows = c.execute(select(Job.id, Job.state).where(Job.id.in_(ids))).all()
        return dict(rows)
    finally:
        engine.dispose()


def wait_states(url, ids, wanted: set[str], timeout_s=120) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        st = states(url, ids)
        if all(v in wanted for v in st.values()) and len(st) == len(ids):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; states: {st}")
        time.sleep(0.3)


def backend_copies(backend: SlurmBackend, gateway_id: str) -> int:
    return sum(1 for st in backend.list_gateway_jobs() if st.gateway_job_id == gateway_id)


def dispatch_events(url: str, job_id: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return list(c.execute(select(JobEvent.reason).where(
                JobEvent.job_id == job_id, JobEvent.to_state == "dispatching")).scalars())
    finally:
        engine.dispose()


def ledger_problems(gw) -> list[str]:
    from gateway.ledger import reading as ledger_reading

    with gw.session() as s:
        return ledger_reading.verify(s)


def test_kill_9_after_claim_before_submit(gateway, workers, pg_url, slurm_backend):
    [job] = submit(gateway)
    w = workers.start(test_pause_after_claim_s=30)
    wait_states(pg_url, [job], {"dispatching"}, 30)
    os.kill(w.pid, signal.SIGKILL)
    w.wait()
    assert backend_copies(slurm_backend, job) == 0  # it died before submitting
    workers.start()  # a fresh process re-drives the expired claim
    assert wait_states(pg_url, [job], FINAL, 120)[job] == "succeeded"
    assert backend_copies(slurm_backend, job) == 1
    assert ledger_problems(gateway) == []


def test_kill_9_after_submit_before_recording(gateway, workers, pg_url, slurm_backend):
    [job] = submit(gateway)
    w = workers.start(test_pause_after_submit_s=30)
    deadline = time.monotonic() + 60
    while slurm_backend.find_by_gateway_id(job) is None:  # on Slurm, registry does not know it yet
        assert time.monotonic() < deadline, "submission never reached Slurm"
        time.sleep(0.2)
    assert states(pg_url, [job])[job] == "dispatching"
    os.kill(w.pid, signal.SIGKILL)
    w.wait()
    workers.start()
    assert wait_states(pg_url, [job], FINAL, 120)[job] == "succeeded"
    assert backend_copies(slurm_backend, job) == 1
    engine = create_engine(pg_url)
    with engine.connect() as c:
        reasons = list(c.execute(select(JobEvent.reason).where(JobEvent.job_id == job)).scalars())
    engine.dispose()
    assert any(r.startswith("adopted existing slurm job") for r in reasons), reasons
    assert ledger_problems(gateway) == []


def test_two_workers_never_double_dispatch(gateway, workers, pg_url, slurm_backend):
    ids = submit(gateway, n=12, command=("sleep", "1"))
    workers.start()
    workers.start()
    final = wait_states(pg_url, ids, FINAL, 240)
    assert set(final.values()) == {"succeeded"}, final
    for job in ids:
        assert backend_copies(slurm_backend, job) == 1, job
        assert len(dispatch_events(pg_url, job)) == 1, job
    assert ledger_problems(gateway) == []


def test_slurmrestd_outage_keeps_jobs_pending_then_dispatches_once(gateway, workers, pg_url, slurm_backend,
                                                                    slurm_cluster):
    pidfile = Path(slurm_cluster["SLURM_STACK_DIR"]) / "run" / "slurmrestd.pid"
    os.kill(int(pidfile.read_text()), signal.SIGTERM)
    time.sleep(1)
    try:
        ids = submit(gateway, n=3)
        workers.start()

        def reasons() -> list[str]:  # the worker's first rounds (a few seconds on a loaded machine)
            with gateway.session() as s:
                return [j.state_reason for j in s.scalars(select(Job).where(Job.id.in_(ids)))]

        wait_for(lambda: all("unavailable" in r for r in reasons()), 60, "the pool's outage in every job's reason",
                 reasons)
        st = states(pg_url, ids)
        assert set(st.values()) == {"pending"}, st
    finally:
        subprocess.run(["bash", str(REPO / "stack/slurm/up.sh"), slurm_cluster["SLURM_VERSION"]], check=True,
                       capture_output=True)
    final = wait_states(pg_url, ids, FINAL, 120)
    assert set(final.values()) == {"succeeded"}, final
    for job in ids:
        assert backend_copies(slurm_backend, job) == 1
    assert ledger_problems(gateway) == []


def test_postgres_restart_is_survived(gateway, workers, pg_url, slurm_backend, own_postgres_server):
    ids = submit(gateway, n=4, command=("sleep", "3"))
    w = workers.start()
    wait_states(pg_url, ids, {"queued", "starting", "running", "succeeded"}, 60)
    # The module's own server (never the stack's, which the other lanes use, nor the machine's).
    own_postgres_server.run("restart")
    final = wait_states(pg_url, ids, FINAL, 120)
    assert set(final.values()) == {"succeeded"}, final
    assert w.poll() is None, "the worker died with the database restart"
    for job in ids:
        assert backend_copies(slurm_backend, job) == 1
    # the API process's pool reconnects too
    assert gateway.client.get("/readyz").status_code == 200
    assert ledger_problems(gateway) == []


# ---------------------------------------------------------------- recovery faster than a lease
# (issue #47, item 6; gateway/dispatch/liveness.py) The lease is 10 minutes in these tests: a
# job that moves on within a minute was taken over because its worker's lock went, not its lease.
LONG_LEASE = {"dispatch_lease_s": 600, "dispatch_owner_grace_s": 2}


def reasons_of(url: str, job_id: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return list(c.execute(select(JobEvent.reason).where(JobEvent.job_id == job_id)
                                  .order_by(JobEvent.id)).scalars())
    finally:
        engine.dispose()


def test_a_dead_workers_claim_is_taken_over_long_before_its_lease(gateway, workers, pg_url, slurm_backend):
    [job] = submit(gateway)
    w = workers.start(test_pause_after_claim_s=60, **LONG_LEASE)
    wait_states(pg_url, [job], {"dispatching"}, 30)
    workers.start(**LONG_LEASE)  # alive meanwhile: it leaves a live worker's claim alone
    time.sleep(4)
    assert states(pg_url, [job])[job] == "dispatching"
    killed = time.monotonic()
    os.kill(w.pid, signal.SIGKILL)
    w.wait()
    assert wait_states(pg_url, [job], FINAL, 60)[job] == "succeeded"
    assert time.monotonic() - killed < 60  # the lease had 9 more minutes to run
    assert backend_copies(slurm_backend, job) == 1
    assert any(r.startswith("dispatch worker ") and " is gone; re-driving" in r
               for r in reasons_of(pg_url, job)), reasons_of(pg_url, job)
    assert ledger_problems(gateway) == []


def test_a_cancel_while_the_claims_worker_is_dead_ends_cancelled(gateway, workers, pg_url, slurm_backend):
    [job] = submit(gateway, command=("sleep", "120"))
    w = workers.start(test_pause_after_submit_s=60, **LONG_LEASE)
    deadline = time.monotonic() + 60
    while slurm_backend.find_by_gateway_id(job) is None:  # on Slurm; the registry does not know it yet
        assert time.monotonic() < deadline, "submission never reached Slurm"
        time.sleep(0.2)
    os.kill(w.pid, signal.SIGKILL)
    w.wait()
    r = gateway.client.post(f"/v1/jobs/{job}/cancel", headers=gateway.headers("alice", ("team-a",)))
    assert r.status_code == 202 and r.json()["state"] == "cancelling", r.text
    workers.start(**LONG_LEASE)
    assert wait_states(pg_url, [job], FINAL, 60)[job] == "cancelled"
    found = slurm_backend.find_by_gateway_id(job)  # the gang that reached Slurm is stopped there
    assert found is None or found.state.final, found
    assert ledger_problems(gateway) == []


def test_a_cancel_while_the_pool_is_cut_off_ends_cancelled(gateway, workers, pg_url, slurm_backend, slurm_cluster):
    [job] = submit(gateway, command=("sleep", "4"))
    workers.start()
    wait_states(pg_url, [job], {"running"}, 60)
    pidfile = Path(slurm_cluster["SLURM_STACK_DIR"]) / "run" / "slurmrestd.pid"
    os.kill(int(pidfile.read_text()), signal.SIGTERM)
    try:
        r = gateway.client.post(f"/v1/jobs/{job}/cancel", headers=gateway.headers("alice", ("team-a",)))
        assert r.status_code == 202, r.text
        time.sleep(8)  # the gang ends on its own meanwhile: the cancel cannot reach Slurm
        assert states(pg_url, [job])[job] == "cancelling"
    finally:
        subprocess.run(["bash", str(REPO / "stack/slurm/up.sh"), slurm_cluster["SLURM_VERSION"]], check=True,
                       capture_output=True)
    assert wait_states(pg_url, [job], FINAL, 60)[job] == "cancelled"
    with gateway.session() as s:
        done = s.get(Job, job)
        assert "the backend ended it first (succeeded, exit code 0" in done.state_reason, done.state_reason
        assert done.ended_at is not None and done.started_at is not None  # its run is charged
    assert ledger_problems(gateway) == []
