"""A running gang's usage is charged while it runs (fair share and budgets see long jobs),
and the end charges only the rest (SQLite and Postgres)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from gateway.ledger import reading as ledger_reading
from gateway.ledger import requeues as ledger_requeues
from gateway.ledger import rules as ledger_rules
from gateway.ledger import service as ledger
from gateway.models.ledger import LedgerEntry, Reservation, UsageBucket
from tests.ledger.dbfixtures import T0, add_account, add_job, in_tx

H = 3600


def _running_job(factory, gpus=8, time_limit_s=4 * H):
    with in_tx(factory) as s:
        add_account(s, "org", budget_gpu_seconds=1000 * H)
        add_account(s, "team", parent="org")
        job = add_job(s, "team", gpus=gpus, time_limit_s=time_limit_s)
    with in_tx(factory) as s:
        ledger.reserve(s, job=job, pool="slurm", actor="t", now=T0)
        ledger.record_start(s, job=job, started_at=T0, actor="t")
    return job


def _bal(s, name="org"):
    b = ledger_reading.get_balance(s, name)
    return b.committed_gpu_seconds, b.charged_gpu_seconds


def test_usage_is_charged_while_running_and_the_end_charges_the_rest(factory):
    job = _running_job(factory)
    with in_tx(factory) as s:
        assert _bal(s) == (8 * 4 * H, 0)
        assert ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=1), actor="t", half_life_s=7 * 86400) == 8 * H
        # moved from commitment to usage: charged + committed unchanged, so no quota check moves
        assert _bal(s) == (8 * 3 * H, 8 * H)
        assert ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=1), actor="t", half_life_s=7 * 86400) == 0  # idempotent
        # fair share sees the running job now, not at its end
        fs = ledger_reading.fairshare(s, now=T0 + timedelta(hours=1), half_life_s=7 * 24 * H)
        assert fs["team"].raw_usage > 0
        assert ledger_reading.verify(s) == []
    with in_tx(factory) as s:
        assert ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=2), actor="t", half_life_s=7 * 86400) == 8 * H
        ledger.record_finish(s, job=job, started_at=T0, ended_at=T0 + timedelta(hours=2, minutes=30), actor="t", half_life_s=7 * 86400)
    with in_tx(factory) as s:
        kinds = [(e.kind, e.committed_gpu_seconds, e.gpu_seconds) for e in s.scalars(
            select(LedgerEntry).where(LedgerEntry.job_id == job.id).order_by(LedgerEntry.id))]
        assert kinds == [("reserve", 8 * 4 * H, 0), ("start", 0, 0), ("usage", -8 * H, 8 * H),
                         ("usage", -8 * H, 8 * H), ("usage", -8 * 1800, 8 * 1800),
                         ("release", -8 * 1.5 * H, 0)]
        assert ledger_rules.charged_gpu_seconds(s, job_id=job.id) == 8 * 2.5 * H
        assert s.get(Reservation, job.id).used_gpu_seconds == 8 * 2.5 * H
        assert _bal(s) == (0, 8 * 2.5 * H)
        assert sum(b.usage_gpu_seconds for b in s.scalars(select(UsageBucket))) == 8 * 2.5 * H
        assert sum(b.jobs for b in s.scalars(select(UsageBucket))) == 1
        assert ledger_reading.verify(s) == []


def test_an_end_reported_before_the_last_accrual_corrects_the_charge(factory):
    """The reconciler may learn of an end late; usage must follow the real end, not the accrual."""
    job = _running_job(factory)
    with in_tx(factory) as s:
        ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=2), actor="t", half_life_s=7 * 86400)
        ledger.record_finish(s, job=job, started_at=T0, ended_at=T0 + timedelta(hours=1, minutes=30), actor="t", half_life_s=7 * 86400)
    with in_tx(factory) as s:
        assert ledger_rules.charged_gpu_seconds(s, job_id=job.id) == 8 * 1.5 * H
        assert _bal(s) == (0, 8 * 1.5 * H)
        assert ledger_reading.verify(s) == []


def test_accrual_stops_at_the_time_limit_and_needs_a_running_job(factory):
    job = _running_job(factory, time_limit_s=H)
    with in_tx(factory) as s:
        assert ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=5), actor="t", half_life_s=7 * 86400) == 8 * H
        assert ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=6), actor="t", half_life_s=7 * 86400) == 0
        assert _bal(s) == (0, 8 * H)
    with in_tx(factory) as s:
        ledger.record_finish(s, job=job, started_at=T0, ended_at=T0 + timedelta(hours=5), actor="t", half_life_s=7 * 86400)
        assert ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=7), actor="t", half_life_s=7 * 86400) == 0  # finished
        assert ledger_rules.charged_gpu_seconds(s, job_id=job.id) == 8 * H
        assert ledger_reading.verify(s) == []


def test_a_requeue_after_accrual_charges_the_segment_once_and_restores_the_commitment(factory):
    job = _running_job(factory, time_limit_s=2 * H)
    with in_tx(factory) as s:
        ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=1), actor="t", half_life_s=7 * 86400)
        assert ledger_requeues.record_requeue(s, job=job, started_at=None, requeued_at=T0 + timedelta(hours=1, minutes=30),
                                     actor="t", half_life_s=7 * 86400) == 8 * 1.5 * H
        # the segment cost 1.5 h; the next run may again use its whole 2 h limit
        assert _bal(s) == (8 * 2 * H, 8 * 1.5 * H)
        assert ledger_reading.last_requeue_at(s, job_id=job.id) == T0 + timedelta(hours=1, minutes=30)
        assert ledger_reading.verify(s) == []
    with in_tx(factory) as s:
        ledger.record_start(s, job=job, started_at=T0 + timedelta(hours=3), actor="t")
        ledger.accrue_usage(s, job=job, now=T0 + timedelta(hours=3, minutes=30), actor="t", half_life_s=7 * 86400)
        ledger.record_finish(s, job=job, started_at=T0 + timedelta(hours=3), ended_at=T0 + timedelta(hours=4),
                             actor="t", half_life_s=7 * 86400)
    with in_tx(factory) as s:
        assert ledger_rules.charged_gpu_seconds(s, job_id=job.id) == 8 * 2.5 * H
        assert _bal(s) == (0, 8 * 2.5 * H)
        assert ledger_reading.verify(s) == []
