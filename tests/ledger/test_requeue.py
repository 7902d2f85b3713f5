"""A job the backend requeues is charged for the segments it ran, never for the queue time
between them (SQLite and Postgres)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from gateway.audit.service import Who
from gateway.kit.errors import Invalid
from gateway.ledger import reading as ledger_reading
from gateway.ledger import requeues as ledger_requeues
from gateway.ledger import rules as ledger_rules
from gateway.ledger import service as ledger
from gateway.models.ledger import LedgerEntry, Reservation, UsageBucket
from tests.ledger.dbfixtures import T0, add_account, add_job, in_tx


def _usage(s, job):
    return [(e.kind, e.gpus, e.committed_gpu_seconds, e.gpu_seconds) for e in s.scalars(
        select(LedgerEntry).where(LedgerEntry.job_id == job.id).order_by(LedgerEntry.id))]


def test_requeued_job_pays_each_run_segment_not_the_queue_time_between(factory):
    with in_tx(factory) as s:
        add_account(s, "org", budget_gpu_seconds=100 * 3600)
        add_account(s, "team", parent="org")
        job = add_job(s, "team", gpus=8, time_limit_s=3600)
    with in_tx(factory) as s:
        ledger.reserve(s, job=job, pool="slurm", actor="t", now=T0)
        ledger.record_start(s, job=job, started_at=T0 + timedelta(minutes=1), actor="t")
    with in_tx(factory) as s:  # ran 10 min, requeued, waits 30 min in the queue
        charged = ledger_requeues.record_requeue(s, job=job, started_at=None, requeued_at=T0 + timedelta(minutes=11),
                                        actor="t", half_life_s=7 * 86400)
        assert charged == 8 * 600
        assert ledger_requeues.record_requeue(s, job=job, started_at=None, requeued_at=T0 + timedelta(minutes=12),
                                     actor="t", half_life_s=7 * 86400) == 0  # a repeated observation charges nothing more
        r = s.get(Reservation, job.id)
        assert (r.status, r.started_at, r.gpus, r.committed_gpu_seconds) == ("reserved", None, 8, 8 * 3600)
        bal = ledger_reading.get_balance(s, "org")
        # back in the queue: GPUs and the whole commitment still held, the segment charged
        assert (bal.reserved_gpus, bal.queued_jobs, bal.committed_gpu_seconds, bal.charged_gpu_seconds) == (
            8, 1, 8 * 3600, 8 * 600)
        assert ledger_reading.last_requeue_at(s, job_id=job.id) == T0 + timedelta(minutes=11)
        assert ledger_reading.verify(s) == []
    with in_tx(factory) as s:  # runs again 30 min later, for 20 min
        ledger.record_start(s, job=job, started_at=T0 + timedelta(minutes=41), actor="t")
        ledger.record_finish(s, job=job, started_at=T0 + timedelta(minutes=41), ended_at=T0 + timedelta(minutes=61),
                             actor="t", half_life_s=7 * 86400)
    with in_tx(factory) as s:
        assert _usage(s, job) == [
            ("reserve", 8, 8 * 3600, 0), ("start", 0, 0, 0), ("usage", 0, 0, 8 * 600),
            ("start", 0, 0, 0), ("usage", 0, -8 * 1200, 8 * 1200), ("release", -8, -8 * 2400, 0)]
        # 10 + 20 minutes on 8 GPUs; the old rule charged first start to end: 60 minutes
        assert ledger_rules.charged_gpu_seconds(s, job_id=job.id) == 8 * 1800
        bal = ledger_reading.get_balance(s, "org")
        assert (bal.reserved_gpus, bal.queued_jobs, bal.committed_gpu_seconds, bal.charged_gpu_seconds) == (
            0, 0, 0, 8 * 1800)
        assert s.get(Reservation, job.id).used_gpu_seconds == 8 * 1800
        assert sum(b.usage_gpu_seconds for b in s.scalars(select(UsageBucket))) == 8 * 1800
        assert sum(b.jobs for b in s.scalars(select(UsageBucket))) == 1
        assert ledger_reading.last_requeue_at(s, job_id=job.id) is None  # finished
        assert ledger_reading.verify(s) == []
        # an admin can refund the whole usage (both segments), not only the last one
        ledger.adjust(s, account="team", kind="refund", gpu_seconds=8 * 1800, by=Who("admin"), reason="bad node",
                      job_id=job.id)
        assert ledger_reading.verify(s) == []


def test_requeued_then_cancelled_before_rerun_keeps_the_first_segment_only(factory):
    with in_tx(factory) as s:
        add_account(s, "org")
        job = add_job(s, "org", gpus=4, time_limit_s=3600)
        ledger.reserve(s, job=job, pool="kubernetes", actor="t", now=T0)
        ledger.record_start(s, job=job, started_at=T0, actor="t")
        ledger_requeues.record_requeue(s, job=job, started_at=T0, requeued_at=T0 + timedelta(seconds=90), actor="t", half_life_s=7 * 86400)
        ledger.record_finish(s, job=job, started_at=None, ended_at=T0 + timedelta(hours=2), actor="t", half_life_s=7 * 86400)
        assert ledger_rules.charged_gpu_seconds(s, job_id=job.id) == 4 * 90
        bal = ledger_reading.get_balance(s, "org")
        assert (bal.reserved_gpus, bal.queued_jobs, bal.committed_gpu_seconds) == (0, 0, 0)
        assert s.get(Reservation, job.id).status == "finished"
        assert ledger_reading.verify(s) == []
        # the refund limit is what was charged: one GPU-second more is refused
        with pytest.raises(Invalid, match="charged 360 GPU-seconds"):
            ledger.adjust(s, account="org", kind="refund", gpu_seconds=4 * 90 + 1, by=Who("admin"), reason="x",
                          job_id=job.id)


def test_requeue_of_a_job_that_never_started_charges_nothing(factory):
    with in_tx(factory) as s:
        add_account(s, "org")
        job = add_job(s, "org", gpus=4)
        ledger.reserve(s, job=job, pool="slurm", actor="t", now=T0)
        assert ledger_requeues.record_requeue(s, job=job, started_at=None, requeued_at=T0, actor="t", half_life_s=7 * 86400) == 0
        assert [k for k, *_ in _usage(s, job)] == ["reserve"]
        assert ledger_reading.last_requeue_at(s, job_id=job.id) is None
        assert ledger_reading.verify(s) == []
