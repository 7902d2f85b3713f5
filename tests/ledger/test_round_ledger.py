"""A dispatch round's batched reservations (gateway/ledger/round.py) write what ledger.reserve writes.

On SQLite and on the stack's Postgres (where the whole batch is one statement). Each case
is compared with the per-job rule it stands in for: the same rows, the same balances, the
same refusals, and ``ledger_reading.verify()`` empty.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.domain.quota import Tally
from gateway.kit.errors import Conflict
from gateway.ledger import reading as ledger_reading
from gateway.ledger import service as ledger
from gateway.ledger.round import RoundLedger
from gateway.models.ledger import AccountPoolBalance, LedgerEntry, Reservation
from gateway.models.specs import field_of
from tests.ledger.dbfixtures import T0, add_account, add_job, in_tx


def reserve_in_round(factory, jobs, pool="slurm"):
    """What a dispatch round does: judge over the view read with its snapshot, then write."""
    with in_tx(factory) as s:
        rl = RoundLedger(s, accounts_=[j.account_name for j in jobs], now=T0)
        tally = Tally(rl.view)
        for job in jobs:
            assert tally.reserve(job, pool, job.total_gpus, field_of(job, "gpu_type", s)) is None
        rl.write(tally.reservations, actor="round")


def ledger_rows(factory, account_names):
    with in_tx(factory) as s:
        return {
            "reservations": sorted((r.job_id, r.pool, r.status, r.gpus, r.committed_gpu_seconds)
                                   for r in s.scalars(select(Reservation))),
            "entries": [(e.kind, e.job_id, e.account_name, e.pool, e.gpus, e.committed_gpu_seconds, e.reason)
                        for e in s.scalars(select(LedgerEntry).order_by(LedgerEntry.id))],
            "balances": {a: (b.reserved_gpus, b.committed_gpu_seconds, b.queued_jobs)
                         for a in account_names for b in [ledger_reading.get_balance(s, a)]},
            "per_pool": sorted((p.account_name, p.pool, p.reserved_gpus) for p in s.scalars(select(AccountPoolBalance))),
            "problems": ledger_reading.verify(s),
        }


def test_a_round_writes_what_reserve_writes_for_every_chain_account(factory):
    with in_tx(factory) as s:
        add_account(s, "org")
        add_account(s, "team-a", parent="org")
        add_account(s, "team-b")
        jobs = [add_job(s, "team-a", gpus=8), add_job(s, "team-a", gpus=16, gpu_type="h100"),
                add_job(s, "team-b", gpus=4)]
    reserve_in_round(factory, jobs)
    got = ledger_rows(factory, ["org", "team-a", "team-b"])
    assert got["problems"] == []
    assert [e[1] for e in got["entries"]] == [j.id for j in jobs]  # in the round's order
    assert got["balances"] == {"org": (24, 24 * 3600, 2), "team-a": (24, 24 * 3600, 2), "team-b": (4, 4 * 3600, 1)}
    assert got["per_pool"] == [("org", "slurm", 24), ("team-a", "slurm", 24), ("team-b", "slurm", 4)]
    # The per-job rule on the same jobs writes the same rows.
    with in_tx(factory) as s:
        for r in s.scalars(select(Reservation)):
            s.delete(r)
    with in_tx(factory) as s:
        for e in s.scalars(select(LedgerEntry)):
            s.delete(e)
        for a in ("org", "team-a", "team-b"):
            b = ledger_reading.get_balance(s, a)
            b.reserved_gpus = b.committed_gpu_seconds = b.queued_jobs = 0
        for p in s.scalars(select(AccountPoolBalance)):
            p.reserved_gpus = 0
    with in_tx(factory) as s:
        for job in jobs:
            ledger.reserve(s, job=s.merge(job), pool="slurm", actor="round", now=T0)
    assert ledger_rows(factory, ["org", "team-a", "team-b"]) == got


def test_a_job_that_already_holds_its_reservation_is_not_counted_twice(factory):
    with in_tx(factory) as s:
        add_account(s, "team-a")
        held, new = add_job(s, "team-a", gpus=8), add_job(s, "team-a", gpus=8)
    reserve_in_round(factory, [held])
    reserve_in_round(factory, [held, new])  # the same reservation again, and one new
    got = ledger_rows(factory, ["team-a"])
    assert got["problems"] == []
    assert [e[1] for e in got["entries"]] == [held.id, new.id]
    assert got["balances"] == {"team-a": (16, 16 * 3600, 2)}


def test_a_released_reservation_is_reserved_again(factory):
    with in_tx(factory) as s:
        add_account(s, "team-a")
        job = add_job(s, "team-a", gpus=8)
    reserve_in_round(factory, [job])
    with in_tx(factory) as s:
        ledger.release(s, job=s.merge(job), actor="t", reason="the backend refused it")
    assert ledger_rows(factory, ["team-a"])["balances"] == {"team-a": (0, 0, 0)}
    reserve_in_round(factory, [job], pool="kubernetes")  # routed elsewhere this time
    got = ledger_rows(factory, ["team-a"])
    assert got["problems"] == []
    assert got["reservations"] == [(job.id, "kubernetes", "reserved", 8, 8 * 3600)]
    assert [e[0] for e in got["entries"]] == ["reserve", "release", "reserve"]
    assert got["balances"] == {"team-a": (8, 8 * 3600, 1)}
    assert ("team-a", "kubernetes", 8) in got["per_pool"]


@pytest.mark.parametrize("then", ["another pool", "finished"])
def test_a_reservation_in_another_pool_or_finished_is_refused_and_nothing_is_written(factory, then):
    with in_tx(factory) as s:
        add_account(s, "team-a")
        job, other = add_job(s, "team-a", gpus=8), add_job(s, "team-a", gpus=8)
    reserve_in_round(factory, [job])
    if then == "finished":
        with in_tx(factory) as s:
            ledger.record_start(s, job=s.merge(job), started_at=T0, actor="t")
            ledger.record_finish(s, job=s.merge(job), started_at=T0, ended_at=T0, actor="t", half_life_s=7 * 86400)
    before = ledger_rows(factory, ["team-a"])
    with pytest.raises(Conflict, match="already holds a reservation in pool slurm" if then == "another pool"
                       else "already finished"):
        reserve_in_round(factory, [other, job], pool="kubernetes")
    assert ledger_rows(factory, ["team-a"]) == before  # the round's other job was not written either


def test_a_limited_chain_is_judged_by_the_round_as_by_the_per_job_rule_and_written_the_same(factory):
    """team-a may hold 16 GPUs under org's 100 GPU-hour budget: the round admits the first two
    8-GPU gangs and refuses the third with the words ledger.reserve uses, and writes what
    ledger.reserve writes (issue #46: the rules in the core, one implementation)."""
    from gateway.kit.errors import QuotaExceeded
    from gateway.models.accounts import AccountQuota

    with in_tx(factory) as s:
        add_account(s, "org")
        add_account(s, "team-a", parent="org")
        s.add(AccountQuota(account_name="team-a", max_gpus=16))
        s.add(AccountQuota(account_name="org", budget_gpu_seconds=100 * 3600, budget_period="month"))
        jobs = [add_job(s, "team-a", gpus=8) for _ in range(3)]
    with in_tx(factory) as s:
        rl = RoundLedger(s, accounts_=["team-a"], now=T0)
        tally = Tally(rl.view)
        said = [tally.reserve(job, "slurm", 8, None) for job in jobs]
        rl.write(tally.reservations, actor="round")
    assert said == [None, None, "team-a: 16 of 16 concurrent GPUs in use, job needs 8"]
    got = ledger_rows(factory, ["org", "team-a"])
    assert got["problems"] == [] and got["balances"]["team-a"] == (16, 16 * 3600, 2)
    with in_tx(factory) as s:  # the per-job rule, on the same state, refuses the third alike
        with pytest.raises(QuotaExceeded) as refused:
            ledger.reserve(s, job=s.merge(jobs[2]), pool="slurm", actor="round", now=T0)
    assert refused.value.detail == said[2]
    assert ledger_rows(factory, ["org", "team-a"]) == got
