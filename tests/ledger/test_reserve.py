"""Reserve / start / finish / release against the admission rule, on SQLite and Postgres."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from gateway.audit.service import Who
from gateway.kit.errors import Conflict, QuotaExceeded
from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from gateway.ledger import service as ledger
from gateway.models.ledger import GpuBillingWeight, LedgerEntry
from tests.ledger.dbfixtures import T0, add_account, add_job, in_tx


def entries(session, job=None):
    stmt = select(LedgerEntry).order_by(LedgerEntry.id)
    if job is not None:
        stmt = stmt.where(LedgerEntry.job_id == job.id)
    return list(session.scalars(stmt))


def test_gang_must_fit_account_and_every_ancestor(factory):
    with in_tx(factory) as s:
        add_account(s, "org", max_gpus=32)
        add_account(s, "team-a", parent="org", max_gpus=32)
        add_account(s, "team-b", parent="org")
        a1, a2 = add_job(s, "team-a", gpus=24), add_job(s, "team-a", gpus=16)
        b1 = add_job(s, "team-b", gpus=16)
    with in_tx(factory) as s:
        ledger.reserve(s, job=a1, pool="slurm", actor="test", now=T0)
    with in_tx(factory) as s, pytest.raises(QuotaExceeded) as exc:
        ledger.reserve(s, job=a2, pool="slurm", actor="test", now=T0)
    assert exc.value.detail == "team-a: 24 of 32 concurrent GPUs in use, job needs 16"
    # team-b has no limit of its own but org's cap covers the whole subtree
    with in_tx(factory) as s, pytest.raises(QuotaExceeded) as exc:
        ledger.reserve(s, job=b1, pool="kubernetes", actor="test", now=T0)
    assert exc.value.detail == "org: 24 of 32 concurrent GPUs in use, job needs 16"
    with in_tx(factory) as s:
        assert [e.kind for e in entries(s)] == ["reserve"]
        assert ledger_rules.admission_check(s, job=b1, pool=None, now=T0) == (False, exc.value.detail)
        assert ledger_reading.verify(s) == []


def test_per_pool_quota_refuses_and_the_waiting_job_caps_are_judged_at_submit_only(factory):
    """max_queued_jobs_per_user counts the jobs that wait to start, at submit (gateway/jobs/caps.py,
    tests/security/test_queue_caps.py); reserving a job already accepted is not refused by it (#46)."""
    with in_tx(factory) as s:
        add_account(s, "org", max_gpus_per_pool={"kubernetes": 8}, max_queued_jobs_per_user=2)
        jobs = [add_job(s, "org", gpus=8) for _ in range(3)]
        k = add_job(s, "org", gpus=16, pool="kubernetes", username="bob")
    with in_tx(factory) as s, pytest.raises(QuotaExceeded, match="0 of 8 concurrent GPUs in use in pool kubernetes"):
        ledger.reserve(s, job=k, pool="kubernetes", actor="t", now=T0)
    with in_tx(factory) as s:
        ledger.reserve(s, job=jobs[0], pool="slurm", actor="t", now=T0)
        ledger.reserve(s, job=jobs[1], pool="slurm", actor="t", now=T0)
    with in_tx(factory) as s:
        ledger.reserve(s, job=jobs[2], pool="slurm", actor="t", now=T0)
        assert ledger_reading.get_balance(s, "org").queued_jobs == 3  # reserved, not started: shown, not limited
        assert ledger_reading.verify(s) == []


def test_budget_counts_running_commitments_and_charges_real_time(factory):
    with in_tx(factory) as s:
        add_account(s, "org", budget_gpu_seconds=10 * 3600)  # 10 GPU-hours per month
        add_account(s, "team", parent="org")
        s.add(GpuBillingWeight(pool="slurm", gpu_type="h100", weight=2.0))
        j1 = add_job(s, "team", gpus=2, time_limit_s=2 * 3600, gpu_type="h100")  # commits 8 GPU-h
        j2 = add_job(s, "team", gpus=1, time_limit_s=3 * 3600, pool="kubernetes", gpu_type="h100")  # weight 1: 3h
    with in_tx(factory) as s:
        ledger.reserve(s, job=j1, pool="slurm", actor="t", now=T0)
        ok, why = ledger_rules.admission_check(s, job=j2, pool="kubernetes", now=T0)
        assert not ok and why == ("org: GPU-hour budget this month: 0.0 used + 8.0 committed of 10.0 GPU-hours, "
                                  "job needs 3.0")
        ledger.record_start(s, job=j1, started_at=T0, actor="t")
        ledger.record_start(s, job=j1, started_at=T0, actor="t")  # idempotent
    with in_tx(factory) as s:  # ran 30 min of the 2 h: charged 2 GPUs x 1800 s x 2.0
        ledger.record_finish(s, job=j1, started_at=T0, ended_at=T0 + timedelta(minutes=30), actor="t", half_life_s=7 * 86400)
        ledger.record_finish(s, job=j1, started_at=T0, ended_at=T0 + timedelta(hours=5), actor="t", half_life_s=7 * 86400)  # no-op
        assert [(e.kind, e.gpu_seconds, e.committed_gpu_seconds) for e in entries(s, j1)] == [
            ("reserve", 0, 28800), ("start", 0, 0), ("usage", 7200, -7200), ("release", 0, -21600)]
        ledger.reserve(s, job=j2, pool="kubernetes", actor="t", now=T0 + timedelta(minutes=31))
        bal = ledger_reading.get_balance(s, "org")
        assert (bal.reserved_gpus, bal.committed_gpu_seconds, bal.charged_gpu_seconds) == (1, 3 * 3600, 7200)
        assert ledger_reading.verify(s) == []


def test_release_is_idempotent_and_refuses_started_jobs(factory):
    with in_tx(factory) as s:
        add_account(s, "org", max_gpus=8)
        j1, j2 = add_job(s, "org", gpus=8), add_job(s, "org", gpus=8)
    with in_tx(factory) as s:
        ledger.reserve(s, job=j1, pool="slurm", actor="t", now=T0)
        ledger.reserve(s, job=j1, pool="slurm", actor="t", now=T0)  # already holds it: no-op
    with in_tx(factory) as s:
        ledger.release(s, job=j1, actor="t", reason="submission failed")
        ledger.release(s, job=j1, actor="t", reason="submission failed")
        ledger.reserve(s, job=j2, pool="slurm", actor="t", now=T0)
        ledger.record_start(s, job=j2, started_at=T0, actor="t")
        with pytest.raises(Conflict):
            ledger.release(s, job=j2, actor="t", reason="x")
        # the released job may be dispatched again once there is room
        ledger.record_finish(s, job=j2, started_at=None, ended_at=T0 + timedelta(hours=2), actor="t", half_life_s=7 * 86400)
        ledger.reserve(s, job=j1, pool="kubernetes", actor="t", now=T0)
        kinds = [e.kind for e in entries(s)]
        assert kinds == ["reserve", "release", "reserve", "start", "usage", "release", "reserve"]
        # clamped at the time limit: 8 GPUs x 3600 s
        assert s.scalar(select(func.sum(LedgerEntry.gpu_seconds))) == 8 * 3600
        assert ledger_reading.verify(s) == []


def test_finish_without_start_charges_nothing(factory):
    with in_tx(factory) as s:
        add_account(s, "org")
        j = add_job(s, "org", gpus=4)
        ledger.reserve(s, job=j, pool="slurm", actor="t", now=T0)
        ledger.record_finish(s, job=j, started_at=None, ended_at=T0 + timedelta(minutes=5), actor="t", half_life_s=7 * 86400)
        assert [(e.kind, e.gpus, e.gpu_seconds) for e in entries(s)] == [("reserve", 4, 0), ("release", -4, 0)]
        bal = ledger_reading.get_balance(s, "org")
        assert (bal.reserved_gpus, bal.queued_jobs, bal.committed_gpu_seconds) == (0, 0, 0)


def test_admin_adjustments_move_the_budget(factory):
    from gateway.kit.errors import Invalid

    with in_tx(factory) as s:
        add_account(s, "org", budget_gpu_seconds=3600)
        j = add_job(s, "org", gpus=1, time_limit_s=3600)
        ledger.reserve(s, job=j, pool="slurm", actor="t", now=T0)
        ledger.record_start(s, job=j, started_at=T0, actor="t")
        ledger.record_finish(s, job=j, started_at=T0, ended_at=T0 + timedelta(hours=1), actor="t", half_life_s=7 * 86400)
        j2 = add_job(s, "org", gpus=1, time_limit_s=600)
        assert not ledger_rules.admission_check(s, job=j2, pool="slurm", now=T0)[0]
        with pytest.raises(Invalid):
            ledger.adjust(s, account="org", kind="refund", gpu_seconds=7200, job_id=j.id, by=Who("root"), reason="x")
        ledger.adjust(s, account="org", kind="refund", gpu_seconds=600, job_id=j.id, by=Who("root"),
                      reason="node failure", now=T0 + timedelta(hours=2))
        assert ledger_rules.admission_check(s, job=j2, pool="slurm", now=T0 + timedelta(hours=2))[0]
        ledger.adjust(s, account="org", kind="debit", gpu_seconds=100, by=Who("root"), reason="manual",
                      now=T0 + timedelta(hours=2))
        assert not ledger_rules.admission_check(s, job=j2, pool="slurm", now=T0 + timedelta(hours=2))[0]
        assert ledger_reading.verify(s) == []


def test_reparent_moves_running_totals(factory):
    from gateway.admin import lifecycle as accounts
    from gateway.kit.errors import Invalid

    with in_tx(factory) as s:
        add_account(s, "org-a")
        add_account(s, "org-b")
        add_account(s, "team", parent="org-a")
        add_account(s, "sub", parent="team")
        j = add_job(s, "sub", gpus=4)
        ledger.reserve(s, job=j, pool="slurm", actor="t", now=T0)
    with in_tx(factory) as s:
        with pytest.raises(Invalid, match="cycle"):
            accounts.update(s, name="team", changes={"parent": "sub"}, by=Who("root"))
        accounts.update(s, name="team", changes={"parent": "org-b"}, by=Who("root"))
    with in_tx(factory) as s:
        assert ledger_reading.get_balance(s, "org-a").reserved_gpus == 0
        assert ledger_reading.get_balance(s, "org-b").reserved_gpus == 4
        ledger.record_finish(s, job=j, started_at=None, ended_at=T0, actor="t", half_life_s=7 * 86400)
        assert ledger_reading.verify(s) == []
