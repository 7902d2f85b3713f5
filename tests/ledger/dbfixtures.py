"""Database fixtures shared by tests/ledger and tests/admin: every test runs on SQLite and
on a real Postgres (ISTHMUS_TEST_POSTGRES_URL), each starting from an empty migrated schema."""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from gateway.kit.db import make_engine, make_sessionmaker, transaction

PG_URL = os.environ.get("ISTHMUS_TEST_POSTGRES_URL",
                        "postgresql+psycopg://isthmus:isthmus@127.0.0.1:5432/isthmus_ledger")
REQUIRE_STACK = os.environ.get("ISTHMUS_REQUIRE_STACK") == "1"
TABLES = ["ledger_entry", "ledger_reservation", "usage_bucket", "fairshare_usage", "gpu_billing_weight",
          "account_balance", "account_quota", "account_member", "job_event", "idempotency_key", "job", "account"]

_pg_state: dict[str, object] = {}


def _pg_ready() -> str | None:
    """None when Postgres is reachable and migrated, else why not."""
    if "error" in _pg_state:
        return _pg_state["error"]  # type: ignore[return-value]
    try:
        eng = create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with eng.connect() as conn:
            conn.execute(text("SELECT 1"))
        eng.dispose()
        from gateway.cli import run_migrations

        run_migrations(PG_URL)
        _pg_state["error"] = None
    except Exception as exc:  # noqa: BLE001 - any failure means "no Postgres here"
        _pg_state["error"] = f"Postgres at {PG_URL} unreachable ({type(exc).__name__}: {exc}); " \
                             "set ISTHMUS_TEST_POSTGRES_URL"
    return _pg_state["error"]  # type: ignore[return-value]


def wipe_postgres(url: str = PG_URL) -> None:
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


def require_postgres() -> None:
    why = _pg_ready()
    if why:
        if REQUIRE_STACK:
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path, sqlite_template) -> str:
    if request.param == "sqlite":
        path = tmp_path / f"ledger-{uuid.uuid4().hex[:8]}.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"
    require_postgres()
    wipe_postgres()
    return PG_URL


@pytest.fixture
def pg_url() -> str:
    require_postgres()
    wipe_postgres()
    return PG_URL


@pytest.fixture
def engine(db_url):
    eng = make_engine(db_url, pool_size=20)
    yield eng
    eng.dispose()


@pytest.fixture
def factory(engine):
    return make_sessionmaker(engine)


# ----------------------------------------------------------------- factories

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc)


def add_account(session, name, parent=None, shares=1, **quota):
    from gateway.accounts import service as accounts

    accounts.create(session, name=name, parent_name=parent, shares=shares)
    if quota:
        accounts.set_quota(session, name=name, values=quota, actor="test")


def add_job(session, account, gpus=8, time_limit_s=3600, pool="slurm", username="alice", gpu_type=None,
            workers=1):
    from gateway.jobs.models import Job
    from gateway.kit.timeutil import new_id, utcnow

    spec = {"command": ["true"], "gpu_type": gpu_type, "cpus_per_worker": 1, "memory_per_worker": "1Gi"}
    job = Job(id=new_id(), name="j", account_name=account, submitted_by=f"dev:{username}", username=username,
              requested_backend=pool, backend=pool, state="pending", state_reason="", spec=spec,
              workers=workers, gpus_per_worker=gpus // workers, total_gpus=gpus, time_limit_s=time_limit_s,
              priority=0, routing_reason="", dispatch_attempts=0, created_at=utcnow(), updated_at=utcnow())
    session.add(job)
    session.flush()
    return job


def in_tx(factory):
    return transaction(factory)
