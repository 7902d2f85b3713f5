"""Database fixtures shared by tests/ledger and tests/admin: every test runs on SQLite and
on the stack's real Postgres, each starting from an empty migrated schema: a copy of the
SQLite template per test; on Postgres, a database per module (a copy of the session's
migrated template, tests/conftest.py), its ledger tables emptied before each test."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from gateway.audit.service import Who
from gateway.kit.db import make_engine, make_sessionmaker, transaction

TABLES = ["ledger_entry", "ledger_reservation", "usage_bucket", "fairshare_usage", "gpu_billing_weight",
          "account_balance", "account_quota", "account_member", "job_event", "idempotency_key", "job", "account"]


@pytest.fixture(scope="module")
def ledger_pg_database(databases) -> Iterator[str]:
    """This module's migrated Postgres database (a copy of the session's template), dropped
    after the module (a missing server skips, or fails under ISTHMUS_REQUIRE_STACK=1)."""
    with databases.create("postgres") as url:
        yield url


def wipe_postgres(url: str) -> None:
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
    eng.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    from gateway.cli import run_migrations

    path = tmp_path_factory.mktemp("ledger-template") / "template.db"
    run_migrations(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path, sqlite_template) -> str:
    if request.param == "sqlite":
        path = tmp_path / f"ledger-{uuid.uuid4().hex[:8]}.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"
    url = request.getfixturevalue("ledger_pg_database")
    wipe_postgres(url)
    return url


@pytest.fixture
def pg_url(ledger_pg_database) -> str:
    wipe_postgres(ledger_pg_database)
    return ledger_pg_database


@pytest.fixture
def engine(db_url):
    eng = make_engine(db_url, pool_size=20)
    yield eng
    eng.dispose()


@pytest.fixture
def factory(engine):
    return make_sessionmaker(engine)


# ----------------------------------------------------------------- factories

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def add_account(session, name, parent=None, shares=1, **quota):
    from gateway.accounts import service as accounts
    from gateway.admin import lifecycle

    lifecycle.create(session, name=name, parent_name=parent, shares=shares, by=Who.system("test"))
    if quota:
        accounts.set_quota(session, name=name, values=quota, by=Who.system("test"))


def add_job(session, account, gpus=8, time_limit_s=3600, pool="slurm", username="alice", gpu_type=None,
            workers=1):
    from gateway.kit.timeutil import new_id, utcnow
    from gateway.models.jobs import Job

    spec = {"command": ["true"], "gpu_type": gpu_type, "cpus_per_worker": 1, "memory_per_worker": "1Gi"}
    job = Job(id=new_id(), name="j", account_name=account, submitted_by=f"dev:{username}", username=username,
              requested_pool=pool, pool=pool, state="pending", state_reason="", spec=spec,
              workers=workers, gpus_per_worker=gpus // workers, total_gpus=gpus, time_limit_s=time_limit_s,
              priority=0, routing_reason="", dispatch_attempts=0, created_at=utcnow(), updated_at=utcnow())
    session.add(job)
    session.flush()
    return job


def in_tx(factory):
    return transaction(factory)
