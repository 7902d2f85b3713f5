"""Migrations and models agree, and upgrade -> downgrade -> upgrade works, on both databases."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from gateway.models import metadata
from tests.conftest import REPO, postgres_database


@pytest.fixture(params=["sqlite", "postgres"])
def empty_db(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    with postgres_database() as url:
        yield url


def _config(url: str) -> Config:
    cfg = Config(str(REPO / "alembic.ini"))
    cfg.attributes["database_url"] = url
    return cfg


# Alembic cannot reflect expression indexes (``priority DESC``) and reports a spurious
# remove/add pair for them; they are checked directly by _expression_indexes_present.
EXPRESSION_INDEXES = {"ix_job_queue": ["state", "account_name", "priority", "id"]}


def _diff(url: str):
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "render_as_batch": True})
            diff = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()
    _expression_indexes_present(url)
    return [d for d in diff if not (isinstance(d, tuple) and d[0] in ("add_index", "remove_index")
                                    and d[1].name in EXPRESSION_INDEXES)]


def _expression_indexes_present(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if url.startswith("sqlite"):
                sql = conn.exec_driver_sql(
                    "SELECT sql FROM sqlite_master WHERE type='index' AND name='ix_job_queue'").scalar()
            else:
                sql = conn.exec_driver_sql("SELECT indexdef FROM pg_indexes WHERE indexname='ix_job_queue'").scalar()
    finally:
        engine.dispose()
    assert sql, "ix_job_queue missing"
    flat = sql.replace('"', "").lower()
    for col in EXPRESSION_INDEXES["ix_job_queue"]:
        assert col in flat, sql
    assert "priority desc" in flat, sql


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_models_and_migrations_agree(empty_db):
    command.upgrade(_config(empty_db), "head")
    assert _diff(empty_db) == []


def test_upgrade_downgrade_upgrade(empty_db):
    cfg = _config(empty_db)
    command.upgrade(cfg, "head")
    assert _tables(empty_db) == set(metadata.tables)
    command.downgrade(cfg, "base")
    assert _tables(empty_db) == set()
    command.upgrade(cfg, "head")
    assert _tables(empty_db) == set(metadata.tables)
    assert _diff(empty_db) == []
