"""A requeue is a new admission: repeated requeues of one job never push a GPU-hour budget
below zero (issue #12, finding 3). Ledger-level, on SQLite and Postgres; the end-to-end
scenarios on the real Slurm cluster are in tests/dispatch/test_slurm_e2e.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from adapters.base import BackendState, JobStatus
from gateway.domain.states import JobState
from gateway.domain.status import requeued_at
from gateway.ledger import reading as ledger_reading
from gateway.ledger import requeues as ledger_requeues
from gateway.ledger import rules as ledger_rules
from gateway.ledger import service as ledger
from gateway.models.accounts import AccountQuota
from gateway.models.ledger import Reservation
from tests.ledger.dbfixtures import T0, add_account, add_job, in_tx

HOUR = 3600


def _remaining(s, name: str) -> int:
    q = s.scalar(select(AccountQuota).where(AccountQuota.account_name == name))
    bal = ledger_reading.get_balance(s, name)
    return q.budget_gpu_seconds - ledger_rules.charged_in_period(s, name, T0.date().replace(day=1)) - bal.committed_gpu_seconds


def test_five_requeues_of_one_job_never_take_a_budget_below_zero(factory):
    """The issue's scenario: an 8 GPU-hour budget, one 8-GPU job with a 1 h limit, requeued
    after 55 min each time. The old rule restored the whole commitment at each requeue and
    ended at about -38.5 GPU-hours; now the first requeue that no longer fits is refused."""
    with in_tx(factory) as s:
        add_account(s, "org", budget_gpu_seconds=8 * HOUR)
        add_account(s, "team", parent="org")
        job = add_job(s, "team", gpus=8, time_limit_s=HOUR)
    with in_tx(factory) as s:
        ledger.reserve(s, job=job, pool="slurm", actor="t", now=T0)
    refusals = []
    t = T0
    for _ in range(5):
        with in_tx(factory) as s:
            if s.get(Reservation, job.id).status != "reserved":
                break
            ledger.record_start(s, job=job, started_at=t, actor="t")
            t += timedelta(minutes=55)
            out = ledger_requeues.requeue(s, job=job, started_at=None, requeued_at=t, actor="t", now=t, half_life_s=7 * 86400)
            refusals.append(out.over_budget)
            assert ledger_reading.verify(s) == []
            assert _remaining(s, "org") >= 0, _remaining(s, "org")
        t += timedelta(minutes=5)
        if out.over_budget:
            break
    assert refusals[0] is not None and "org: GPU-hour budget" in refusals[0], refusals
    assert "another run needs 8.0" in refusals[0]
    with in_tx(factory) as s:
        # the gateway cancels it; the backend confirms before it ran again
        ledger.record_finish(s, job=job, started_at=None, ended_at=t, actor="t", half_life_s=7 * 86400)
        assert ledger_rules.charged_gpu_seconds(s, job_id=job.id) == 8 * 55 * 60
        bal = ledger_reading.get_balance(s, "org")
        assert (bal.reserved_gpus, bal.queued_jobs, bal.committed_gpu_seconds) == (0, 0, 0)
        assert _remaining(s, "org") == 8 * HOUR - 8 * 55 * 60
        assert ledger_reading.verify(s) == []


def test_a_refused_requeue_that_restarts_before_the_cancel_is_capped_by_what_is_left(factory):
    """If the backend restarts the gang before the gateway's cancel lands, the run is charged
    (the GPUs were held) but only up to what remained of the original admission."""
    with in_tx(factory) as s:
        add_account(s, "org", budget_gpu_seconds=8 * HOUR)
        job = add_job(s, "org", gpus=8, time_limit_s=HOUR)
        ledger.reserve(s, job=job, pool="kubernetes", actor="t", now=T0)
        ledger.record_start(s, job=job, started_at=T0, actor="t")
        ledger.accrue_usage(s, job=job, now=T0 + timedelta(minutes=20), actor="t", half_life_s=7 * 86400)
        out = ledger_requeues.requeue(s, job=job, started_at=None, requeued_at=T0 + timedelta(minutes=40), actor="t", half_life_s=7 * 86400)
        assert out.over_budget and out.charged_gpu_seconds == 8 * 40 * 60
        assert s.get(Reservation, job.id).committed_gpu_seconds == 8 * 20 * 60  # the rest of the first admission
        assert _remaining(s, "org") == 0
        ledger.record_start(s, job=job, started_at=T0 + timedelta(minutes=41), actor="t")
        ledger.record_finish(s, job=job, started_at=None, ended_at=T0 + timedelta(minutes=141), actor="t", half_life_s=7 * 86400)
        assert ledger_rules.charged_gpu_seconds(s, job_id=job.id) == 8 * HOUR  # 40 min + at most the 20 min left
        assert _remaining(s, "org") == 0
        assert ledger_reading.verify(s) == []


def test_a_requeue_that_fits_restores_the_whole_commitment(factory):
    with in_tx(factory) as s:
        add_account(s, "org", budget_gpu_seconds=100 * HOUR)
        job = add_job(s, "org", gpus=8, time_limit_s=HOUR)
        ledger.reserve(s, job=job, pool="slurm", actor="t", now=T0)
        ledger.record_start(s, job=job, started_at=T0, actor="t")
        out = ledger_requeues.requeue(s, job=job, started_at=None, requeued_at=T0 + timedelta(minutes=10), actor="t", half_life_s=7 * 86400)
        assert out == ledger_requeues.Requeued(8 * 600, None)
        assert s.get(Reservation, job.id).committed_gpu_seconds == 8 * HOUR
        assert ledger_reading.get_balance(s, "org").committed_gpu_seconds == 8 * HOUR
        assert ledger_reading.verify(s) == []


# --------------------------------------------------- when was the gang requeued (pure)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STARTED = NOW - timedelta(hours=1)


def _status(state, *, requeued=None, started=None):
    return JobStatus(backend_job_id="1", gateway_job_id="g", state=state, requeued_at=requeued, started_at=started)


def test_requeue_time_is_the_backends_not_when_the_gateway_looked():
    """Seen an hour late (gateway down), the requeue 10 min into the run charges 10 min."""
    at = requeued_at(state=JobState.RUNNING, started_at=STARTED,
                     status=_status(BackendState.QUEUED, requeued=STARTED + timedelta(minutes=10)), now=NOW)
    assert at == STARTED + timedelta(minutes=10)


def test_a_requeue_and_restart_between_two_looks_is_still_a_requeue():
    restarted = _status(BackendState.RUNNING, requeued=STARTED + timedelta(minutes=10),
                        started=STARTED + timedelta(minutes=30))
    assert requeued_at(state=JobState.RUNNING, started_at=STARTED, status=restarted, now=NOW) == \
        STARTED + timedelta(minutes=10)
    # a requeue older than the recorded run is the previous one: nothing new
    assert requeued_at(state=JobState.RUNNING, started_at=STARTED + timedelta(minutes=30), status=restarted,
                       now=NOW) is None


def test_without_a_backend_time_the_requeue_is_when_it_was_seen():
    assert requeued_at(state=JobState.RUNNING, started_at=STARTED, status=_status(BackendState.REQUEUED),
                       now=NOW) == NOW
    assert requeued_at(state=JobState.QUEUED, started_at=None, status=_status(BackendState.QUEUED), now=NOW) is None


# ------------------------------------------- the owner cannot requeue it (real Slurm)

def _owner_requeue(env: dict[str, str], user: str, backend_job_id: str):
    from tests import slurm_cli

    return slurm_cli.run(env, "scontrol", "requeue", backend_job_id, as_user=user, check=False)


@pytest.mark.slurm
@pytest.mark.parametrize("version,transport", [("22.05", "cli"), ("24.11", "rest"), ("26.05", "rest")])
def test_the_owner_cannot_requeue_a_gateway_job_behind_its_back(version, transport):
    """Jobs are submitted non-requeueable, so ``scontrol requeue`` by the job's own user is
    refused and the gang keeps running (Slurm 22.05's REST API ignores the flag: there the
    gateway's requeue handling is the only guard, see docs/slurm.md)."""
    import time
    import uuid

    from adapters.base import SubmitRequest
    from adapters.slurm.backend import SlurmBackend
    from adapters.slurm.settings import SlurmSettings
    from tests.dispatch.conftest import slurm_backend_options, slurm_env

    env = slurm_env(version)
    backend = SlurmBackend(SlurmSettings(**slurm_backend_options(env, transport)))
    gid = f"norq-{uuid.uuid4().hex[:10]}"
    result = backend.submit(SubmitRequest(gateway_job_id=gid, name="norq", account="team-a", user="alice",
                                          command=["sleep", "60"], workers=1, gpus_per_worker=0, cpus_per_worker=1,
                                          memory_mib_per_worker=256, time_limit_s=120, first_attempt=True))
    try:
        deadline = time.monotonic() + 60
        while backend.status(result.backend_job_id).state is not BackendState.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        done = _owner_requeue(env, "alice", result.backend_job_id)
        assert done.returncode != 0 and "disabled" in done.stderr, (done.returncode, done.stderr)
        time.sleep(1)
        status = backend.status(result.backend_job_id)
        assert status.state is BackendState.RUNNING and status.requeued_at is None, status
    finally:
        backend.cancel(result.backend_job_id)
        backend.close()
