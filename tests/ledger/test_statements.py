"""Statements equal the ledger (issue #49, item 3): a month of generated history, written
through the ledger's own writers (reserve, start, accruals, requeues, retried attempts,
finishes, releases, credits, debits, refunds) across two pools, three GPU types and a tree of
accounts, on SQLite and Postgres. The statement's GPU-seconds equal the ledger's charges per
account and in all, its cost total is the sum of its rounded lines, and each usage line adds
up over the jobs' attempts behind it."""

from __future__ import annotations

import inspect
import random
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest
from sqlalchemy import func, select

from gateway.domain.prices import PriceList
from gateway.jobs import service as jobs
from gateway.kit.errors import Invalid
from gateway.ledger import reading as ledger_reading
from gateway.ledger import requeues as ledger_requeues
from gateway.ledger import rules as ledger_rules
from gateway.ledger import service as ledger
from gateway.ledger import statements
from gateway.models.jobs import JobAttempt
from gateway.models.ledger import (
    GpuBillingWeight,
    LedgerEntry,
    Reservation,
    UsageBucket,
)
from tests.ledger.dbfixtures import add_account, add_job, in_tx

H = 3600
HALF_LIFE = 7 * 86400
NOV, DEC = date(2026, 11, 1), date(2026, 12, 1)
ACCOUNTS = ("org", "team-a", "team-a-ml", "team-b")
PRICES = PriceList(currency="EUR", pools={
    "slurm": {"h100": Decimal("2.35"), "a100": Decimal("1.1"), "default": Decimal("0.333")},
    "kubernetes": {"h100": Decimal("2.50")},  # no default: its untyped jobs are unpriced
})


def _at(day: int, seconds: int) -> datetime:
    return datetime(2026, 10, 31, tzinfo=UTC) + timedelta(days=day, seconds=seconds)


def _month_of_history(factory, seed: int = 49) -> dict:
    """About 70 jobs from 31 October to 1 December (some cross either month boundary)."""
    rnd = random.Random(seed)
    with in_tx(factory) as s:
        add_account(s, "org", budget_gpu_seconds=10**9)
        add_account(s, "team-a", parent="org")
        add_account(s, "team-a-ml", parent="team-a")
        add_account(s, "team-b", parent="org")
        # (configuration, not history: set as the admin API would, without its audit record)
        s.add(GpuBillingWeight(pool="slurm", gpu_type="h100", weight=2.0, updated_at=_at(0, 0)))
    finished: list[tuple[str, str]] = []
    for i in range(70):
        account = rnd.choice(ACCOUNTS)
        pool = rnd.choice(("slurm", "kubernetes"))
        gpu_type = rnd.choice(("h100", "a100", None))
        gpus = rnd.choice((1, 2, 4, 8))
        limit = rnd.choice((2, 6, 30)) * H
        t = _at(rnd.randrange(0, 31), rnd.randrange(0, 86400))
        with in_tx(factory) as s:
            job = add_job(s, account, gpus=gpus, time_limit_s=limit, pool=pool, gpu_type=gpu_type,
                          username=rnd.choice(("alice", "bob")))
            ledger.reserve(s, job=job, pool=pool, actor="t", now=t)
        if i % 13 == 5:  # never started: released
            with in_tx(factory) as s:
                ledger.release(s, job=job, actor="t", reason="the backend refused it")
            continue
        runs = 1 + (i % 7 == 3) + (i % 11 == 2)  # some jobs run a second and third attempt
        for attempt in range(runs):
            start = t + timedelta(seconds=rnd.randrange(10, 3000))
            with in_tx(factory) as s:
                ledger.record_start(s, job=job, started_at=start, actor="t")
            now = start
            for _ in range(rnd.randrange(0, 4)):  # accruals while it runs
                now += timedelta(seconds=rnd.randrange(300, 4000))
                with in_tx(factory) as s:
                    ledger.accrue_usage(s, job=job, now=now, actor="t", half_life_s=HALF_LIFE)
            if i % 5 == 1:  # the backend requeues it once: the same attempt runs again
                requeued = now + timedelta(seconds=rnd.randrange(60, 900))
                with in_tx(factory) as s:
                    ledger_requeues.record_requeue(s, job=job, started_at=start, requeued_at=requeued, actor="t",
                                                   half_life_s=HALF_LIFE, now=requeued)
                start = now = requeued + timedelta(seconds=120)
                with in_tx(factory) as s:
                    ledger.record_start(s, job=job, started_at=start, actor="t")
            end = now + timedelta(seconds=rnd.randrange(30, 5 * H))
            last = attempt == runs - 1
            with in_tx(factory) as s:
                job = s.merge(job)
                before = sum(a.charged_gpu_seconds for a in jobs.attempts_of(s, job.id))
                ledger.record_finish(s, job=job, started_at=None, ended_at=end, actor="t", half_life_s=HALF_LIFE,
                                     retried=not last)
                if not last:  # as the dispatcher retries an attempt (dispatch/outcomes.py)
                    charged = ledger_rules.charged_gpu_seconds(s, job_id=job.id) - before
                    jobs.end_attempt(s, job, outcome="node_failure", started_at=start, ended_at=end, exit_code=None,
                                     backend_reason="node lost", charged_gpu_seconds=charged)
                    t = end + timedelta(seconds=60)
                    ledger.reserve(s, job=job, pool=pool, actor="t", now=t)
        finished.append((job.id, account))
    with in_tx(factory) as s:  # adjustments: credits, debits (with and without a pool), refunds
        for k, (job_id, account) in enumerate(finished[:6]):
            charged = s.get(Reservation, job_id).used_gpu_seconds  # (the last attempt's, what a refund may give back)
            if charged > 10:
                _adjust(s, account=account, kind="refund", gpu_seconds=charged // 3,
                              reason="partial refund", job_id=job_id, now=_at(5 + k, 100))
        _adjust(s, account="team-a", kind="credit", gpu_seconds=7 * H + 17,
                      reason="outage 2026-11-03", now=_at(4, 10))
        _adjust(s, account="team-b", kind="debit", gpu_seconds=2 * H, reason="manual run",
                      pool="slurm", now=_at(20, 10))
        _adjust(s, account="team-a-ml", kind="credit", gpu_seconds=H, reason="in December",
                      now=_at(31, 500))
        _adjust(s, account="org", kind="debit", gpu_seconds=999, reason="in October",
                      now=_at(0, 500))
        assert ledger_reading.verify(s) == []
    return {"finished": finished}


def _adjust(s, **kw):
    """``ledger.adjust`` as an admin calls it; the audit log (being built beside this) names the
    caller with ``by`` instead of ``actor``: either signature."""
    if "by" in inspect.signature(ledger.adjust).parameters:
        from gateway.audit.service import Who

        return ledger.adjust(s, by=Who("admin"), **kw)
    return ledger.adjust(s, actor="admin", **kw)


def _ledger_charged(s, names, since: date, until: date) -> int:
    start = datetime(since.year, since.month, since.day, tzinfo=UTC)
    end = datetime(until.year, until.month, until.day, tzinfo=UTC)
    return int(s.scalar(select(func.coalesce(func.sum(LedgerEntry.gpu_seconds), 0)).where(
        LedgerEntry.account_name.in_(names), LedgerEntry.at >= start, LedgerEntry.at < end)) or 0)


def _bucket_charged(s, names, since: date, until: date) -> int:
    return int(s.scalar(select(func.coalesce(func.sum(UsageBucket.gpu_seconds), 0)).where(
        UsageBucket.account_name.in_(names), UsageBucket.day >= since, UsageBucket.day < until)) or 0)


def test_a_months_statement_equals_the_ledger(factory):
    _month_of_history(factory)
    with in_tx(factory) as s:
        st = statements.statement(s, account="org", since=NOV, until=DEC, prices=PRICES, children=True, detail=True)
        assert st.accounts == ("org", "team-a", "team-a-ml", "team-b")
        # In all: the lines' GPU-seconds are exactly what the ledger charged the subtree in November,
        # by its entries and by its daily buckets alike; the month boundaries cut something off.
        total = _ledger_charged(s, ACCOUNTS, NOV, DEC)
        assert st.gpu_seconds == total == _bucket_charged(s, ACCOUNTS, NOV, DEC)
        assert total != _ledger_charged(s, ACCOUNTS, date(2026, 10, 1), date(2027, 1, 1))
        assert st.budget.used_gpu_seconds == total
        # Per account, and each account's own statement agrees with its lines in the subtree's.
        for name, gpu_seconds, cost in st.subtotals():
            assert gpu_seconds == _ledger_charged(s, [name], NOV, DEC), name
            own = statements.statement(s, account=name, since=NOV, until=DEC, prices=PRICES)
            assert (own.gpu_seconds, own.cost) == (gpu_seconds, cost)
        kinds = {line.kind for line in st.lines}
        assert kinds == {"usage", "refund", "credit", "debit"}
        assert {line.pool for line in st.lines} >= {"slurm", "kubernetes", None}
        # Money: each line rounded once, half up; the total is the sum of the rounded lines.
        for line in st.lines:
            if line.price is None:
                assert line.cost is None
            else:
                exact = Decimal(line.gpu_seconds) * line.price / 3600
                assert line.cost == exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
        assert st.cost == sum(line.cost for line in st.lines if line.cost is not None)
        assert st.unpriced_gpu_seconds == sum(line.gpu_seconds for line in st.lines if line.price is None) != 0
        assert {line.price for line in st.lines if line.pool == "slurm" and line.gpu_type is None} <= {Decimal("0.333")}
        # Every usage line adds up over its jobs' attempts; an attempt inside the month was
        # charged what its job_attempt row says.
        for line in st.lines:
            if line.kind in ("usage", "refund"):
                assert sum(a.gpu_seconds for a in line.attempts) == line.gpu_seconds
        parts: dict[tuple[str, int], int] = {}
        for line in st.lines:
            if line.kind == "usage":
                for a in line.attempts:
                    parts[(a.job_id, a.attempt)] = parts.get((a.job_id, a.attempt), 0) + a.gpu_seconds
        ended = list(s.scalars(select(JobAttempt)))
        assert ended, "the history retries some attempts"
        inside = [a for a in ended if a.started_at is not None and _utc(a.started_at) >= _day(NOV)
                  and _utc(a.ended_at) < _day(DEC)]
        assert inside
        for a in inside:
            assert parts.get((a.job_id, a.number), 0) == a.charged_gpu_seconds, a.job_id
        assert max(n for _, n in parts) >= 2


def test_all_time_equals_the_balances(factory):
    _month_of_history(factory, seed=7)
    with in_tx(factory) as s:
        st = statements.statement(s, account="org", since=date(2026, 1, 1), until=date(2027, 12, 1),
                                  prices=PRICES, children=True)
        assert st.gpu_seconds == ledger_reading.get_balance(s, "org").charged_gpu_seconds
        team_a = statements.statement(s, account="team-a", since=date(2026, 1, 1), until=date(2027, 12, 1),
                                      prices=PRICES, children=True)
        assert team_a.accounts == ("team-a", "team-a-ml")
        assert team_a.gpu_seconds == ledger_reading.get_balance(s, "team-a").charged_gpu_seconds


def test_the_period_defaults_to_a_calendar_month_and_refuses_nonsense():
    now = datetime(2026, 12, 8, 1, 0, tzinfo=UTC)
    assert statements.period(since=None, until=None, now=now) == (date(2026, 12, 1), date(2027, 1, 1))
    assert statements.period(since=date(2026, 2, 1), until=None, now=now) == (date(2026, 2, 1), date(2026, 3, 1))
    assert statements.period(since=None, until=date(2026, 11, 1), now=now) == (date(2026, 10, 1), date(2026, 11, 1))
    with pytest.raises(Invalid) as e:
        statements.period(since=date(2026, 11, 2), until=date(2026, 11, 1), now=now)
    assert e.value.errors[0].field == "query.until"
    with pytest.raises(Invalid) as e:
        statements.period(since=date(2000, 1, 1), until=date(2026, 11, 1), now=now)
    assert e.value.errors[0].field == "query.since"


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _day(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)
