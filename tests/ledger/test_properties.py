"""Property tests: random interleavings of reservations, starts, accruals, requeues, finishes,
releases and admin adjustments keep the ledger consistent and never overspend."""

from __future__ import annotations

import itertools
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from gateway.accounts.tree import subtree_names
from gateway.audit.service import Who
from gateway.kit.db import transaction
from gateway.kit.errors import Conflict, QuotaExceeded
from gateway.ledger import reading as ledger_reading
from gateway.ledger import requeues as ledger_requeues
from gateway.ledger import rules as ledger_rules
from gateway.ledger import service as ledger
from gateway.models.accounts import AccountQuota
from gateway.models.jobs import Job
from gateway.models.ledger import LedgerEntry
from tests.ledger.dbfixtures import T0, add_account, add_job

_run = itertools.count()

op = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 2), st.sampled_from([1, 2, 4, 8, 16]),
              st.sampled_from([600, 3600, 4 * 3600]), st.sampled_from(["slurm", "kubernetes"]),
              st.sampled_from(["alice", "bob"])),
    st.tuples(st.just("start"), st.integers(0, 40)),
    st.tuples(st.just("finish"), st.integers(0, 40), st.integers(0, 5 * 3600)),
    st.tuples(st.just("release"), st.integers(0, 40)),
    st.tuples(st.just("requeue"), st.integers(0, 40), st.integers(0, 5 * 3600)),
    st.tuples(st.just("accrue"), st.integers(0, 40), st.integers(0, 5 * 3600)),
    st.tuples(st.sampled_from(["credit", "debit"]), st.integers(0, 2), st.integers(1, 20 * 3600)),
)


def _check(s, names: list[str]) -> None:
    assert ledger_reading.verify(s) == []
    quotas = {q.account_name: q for q in s.scalars(select(AccountQuota).where(AccountQuota.account_name.in_(names)))}
    for name, q in quotas.items():
        b = ledger_reading.get_balance(s, name)
        assert b.reserved_gpus >= 0 and b.committed_gpu_seconds >= 0 and b.queued_jobs >= 0
        if q.max_gpus is not None:
            assert b.reserved_gpus <= q.max_gpus, name
        held = ledger_rules.pool_balances(s, name)
        for pool, limit in ledger.accounts.effective_quota(s, name)["max_gpus_per_pool"].items():
            if limit.source == name:
                assert held.get(pool, 0) <= limit.value, (name, pool)
        if q.budget_gpu_seconds is not None:
            charged = ledger_rules.charged_in_period(s, name, T0.date().replace(day=1))
            remaining = q.budget_gpu_seconds - charged - b.committed_gpu_seconds
            if remaining < 0:  # only an admin debit may push a budget below zero
                sub = subtree_names(name)
                assert s.scalar(select(func.count()).select_from(LedgerEntry).where(
                    LedgerEntry.kind == "debit", LedgerEntry.account_name.in_(sub))) > 0, name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=40))
def test_random_sequences_keep_the_ledger_consistent(factory, ops):
    p = f"r{next(_run)}"
    names = [f"{p}-org", f"{p}-a", f"{p}-b"]
    with transaction(factory) as s:
        add_account(s, names[0], max_gpus=32, max_gpus_per_pool={"kubernetes": 16}, budget_gpu_seconds=40 * 3600)
        add_account(s, names[1], parent=names[0], max_gpus=16, max_queued_jobs=3)
        add_account(s, names[2], parent=names[0], max_gpus_per_pool={"slurm": 8}, max_queued_jobs_per_user=2)
    jobs: list[str] = []
    started: dict[str, object] = {}
    for i, o in enumerate(ops):
        now = T0 + timedelta(minutes=10 * i)
        try:
            with transaction(factory) as s:
                if o[0] == "reserve":
                    _, acc, gpus, tl, pool, user = o
                    job = add_job(s, names[acc], gpus=gpus, time_limit_s=tl, pool=pool, username=user)
                    jobs.append(job.id)
                    try:
                        with s.begin_nested():
                            ledger.reserve(s, job=job, pool=pool, actor="prop", now=now)
                    except QuotaExceeded:
                        pass
                elif o[0] in ("start", "finish", "release", "requeue", "accrue") and jobs:
                    job = s.get(Job, jobs[o[1] % len(jobs)])
                    if o[0] == "start":
                        ledger.record_start(s, job=job, started_at=now, actor="prop")
                        started.setdefault(job.id, now)
                    elif o[0] == "requeue":
                        st_at = started.get(job.id)
                        ran = ledger_requeues.record_requeue(s, job=job, started_at=st_at,
                                                    requeued_at=(st_at or now) + timedelta(seconds=o[2]), actor="prop", half_life_s=7 * 86400)
                        if st_at is not None and ledger_reading.last_requeue_at(s, job_id=job.id) is not None:
                            started.pop(job.id)  # back in the queue: the next start is a new segment
                        assert ran <= job.total_gpus * min(o[2], job.time_limit_s)
                    elif o[0] == "accrue":
                        st_at = started.get(job.id)
                        ledger.accrue_usage(s, job=job, now=(st_at or now) + timedelta(seconds=o[2]), actor="prop", half_life_s=7 * 86400)
                    elif o[0] == "finish":
                        st_at = started.get(job.id)
                        ledger.record_finish(s, job=job, started_at=st_at,
                                             ended_at=(st_at or now) + timedelta(seconds=o[2]), actor="prop", half_life_s=7 * 86400)
                    else:
                        ledger.release(s, job=job, actor="prop", reason="cancelled while queued")
                elif o[0] in ("credit", "debit"):
                    ledger.adjust(s, account=names[o[1]], kind=o[0], gpu_seconds=o[2], by=Who("admin"),
                                  reason="property test", now=now)
        except Conflict:
            pass  # start/release of a job without (or past) its reservation: refused, nothing written
        with transaction(factory) as s:
            _check(s, names)
            _check_charges(s, jobs)


def _check_charges(s, jobs: list[str]) -> None:
    """A job is never charged more than its GPUs for its time limit per run, nor below zero."""
    from gateway.models.ledger import Reservation

    for job_id in jobs:
        r = s.get(Reservation, job_id)
        if r is None:
            continue
        charged = ledger_rules.charged_gpu_seconds(s, job_id=job_id)
        assert charged >= 0
        if r.status == "finished":
            assert charged == r.used_gpu_seconds, job_id
