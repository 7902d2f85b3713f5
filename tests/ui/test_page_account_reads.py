"""The dashboard's account and ledger reads as plain rows of statements built once (issue #46):
``accounts.visible_accounts``, ``effective_quota``, ``effective_quotas`` and
``ledger.reading.usage`` / ``balance_of`` answer what the ORM reads answered, on SQLite and on
Postgres (where a read session sends them as compiled text)."""

from __future__ import annotations

import contextlib
from datetime import date, timedelta

import pytest
from sqlalchemy import select

from gateway.accounts import service as accounts
from gateway.kit.db import make_engine, make_read_sessionmaker, make_sessionmaker
from gateway.ledger import reading
from gateway.ledger import repository as ledger_repo
from gateway.models.accounts import (
    Account,
    AccountMember,
    AccountPoolQuota,
    AccountQuota,
)
from gateway.models.ledger import AccountBalance, UsageBucket
from tests.conftest import postgres_database


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db(request, tmp_path_factory):
    from gateway.cli import run_migrations

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('account-reads')}/gw.db"
        run_migrations(url)
        database = contextlib.nullcontext(url)
    else:
        database = postgres_database(migrated=True)
    with database as url:
        engine = make_engine(url)
        with make_sessionmaker(engine)() as s:
            s.add_all([Account(name=n, parent_name=p, shares=1) for n, p in
                       (("root", None), ("lab", "root"), ("lab-x", "lab"), ("lab-y", "lab"), ("other", "root"))])
            s.flush()
            s.add_all([AccountQuota(account_name="root", max_gpus=64, budget_gpu_seconds=10**6),
                       AccountQuota(account_name="lab", max_gpus=16, budget_gpu_seconds=5000, budget_period="rolling", budget_window_days=7),
                       AccountQuota(account_name="lab-x", max_queued_jobs=5)])
            s.flush()
            s.add_all([AccountPoolQuota(account_name="root", pool="slurm", max_gpus=32),
                       AccountPoolQuota(account_name="lab", pool="slurm", guaranteed_gpus=4),
                       AccountMember(account_name="lab", username="carol", role="coordinator"),
                       AccountMember(account_name="other", username="carol", role="member"),
                       AccountBalance(account_name="lab-x", reserved_gpus=3, committed_gpu_seconds=7200,
                                      charged_gpu_seconds=100, queued_jobs=2)])
            today = date.today()
            for i, (acc, pool) in enumerate([("lab-x", "slurm"), ("lab-x", ""), ("lab-y", "slurm"), ("lab-x", "slurm")]):
                s.add(UsageBucket(account_name=acc, day=today - timedelta(days=i * 20), pool=pool, gpu_seconds=100 * i + 7,
                                  usage_gpu_seconds=90 * i, adjustment_gpu_seconds=i, jobs=i + 1))
            s.commit()
        yield make_sessionmaker(engine), make_read_sessionmaker(engine)
        engine.dispose()


def _orm_effective(s, name):
    """effective_quota as the ORM read it before issue #46."""
    chain = [a.name for a in accounts.chain(s, name)]
    rows = {q.account_name: q for q in s.scalars(select(AccountQuota).where(AccountQuota.account_name.in_(chain)))}
    pools = list(s.scalars(select(AccountPoolQuota).where(AccountPoolQuota.account_name.in_(chain))))
    return accounts._effective(chain, rows, pools)


def test_visible_accounts_are_the_trees_as_the_orm_read_it(db):
    _, reads = db
    with reads() as s:
        assert accounts.visible_accounts(s, accounts=frozenset(), username="x", is_admin=True) == \
            ["lab", "lab-x", "lab-y", "other", "root"]
        assert accounts.visible_accounts(s, accounts=frozenset({"other", "gone"}), username="carol",
                                         is_admin=False) == ["lab", "lab-x", "lab-y", "other"]
        assert accounts.visible_accounts(s, accounts=frozenset({"lab-y"}), username="", is_admin=False) == ["lab-y"]


def test_effective_quotas_and_usage_are_what_the_orm_reads_answered(db):
    writes, reads = db
    today = date.today()
    names = ("root", "lab", "lab-x", "lab-y", "other")
    ranges = [(today - timedelta(days=90), today + timedelta(days=1), period) for period in ("month", "day")]
    with writes() as orm:  # one session at a time: SQLite's sessions each hold the write lock
        before = {n: _orm_effective(orm, n) for n in names}
        tree = accounts.load_tree(orm)
        reports = [(ledger_repo.usage_report(orm, since=a, until=b, period=p),
                    ledger_repo.usage_report(orm, since=a, until=b, period=p, accounts_in=["lab-x"]))
                   for a, b, p in ranges]
    with reads() as s:
        assert {n: accounts.effective_quota(s, n) for n in names} == before
        assert before["lab-x"]["budget_gpu_seconds"].source == "lab" and before["lab-x"]["budget_period"] == "rolling"
        assert accounts.effective_quotas(s) == before
        assert accounts.effective_quotas(s, tree) == before
        with pytest.raises(accounts.NotFound):
            accounts.effective_quota(s, "nobody")
        for (a, b, p), (every, one) in zip(ranges, reports, strict=True):
            assert reading.usage(s, since=a, until=b, period=p) == every
            assert reading.usage(s, since=a, until=b, period=p, account="lab-x") == one
        assert len(reports[1][0]) == 4 and len(reports[1][1]) == 3
        b = reading.balance_of(s, "lab-x")
        assert (b.reserved_gpus, b.committed_gpu_seconds, b.queued_jobs) == (3, 7200, 2)
