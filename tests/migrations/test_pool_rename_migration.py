"""0009pool with jobs in the table, on SQLite and Postgres: the job's ``backend`` and
``requested_backend`` columns become ``pool`` and ``requested_pool`` with every value (NULL
included) kept, and a downgrade gives the old columns their values back."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, inspect, text

from tests.migrations.test_migrations import _config, _diff, empty_db  # noqa: F401  (fixture)

NOW = "2026-12-03 12:00:00"
LONG = "slurm-a100-frankfurt-production-" + "x" * 31  # 63 characters, the widest pool name
# id, requested pool, routed pool (NULL while pending)
JOBS = [("j1", "auto", None), ("j2", "auto", "slurm"), ("j3", LONG, LONG), ("j4", "kubernetes", None)]


def _seed(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO account (name, parent_name, shares, description, created_at) "
                              "VALUES ('team-a', NULL, 1, '', :t)"), {"t": NOW})
            for job_id, requested, routed in JOBS:
                conn.execute(text(
                    "INSERT INTO job (id, name, account_name, submitted_by, username, requested_backend, backend, "
                    "state, state_reason, spec, workers, gpus_per_worker, total_gpus, time_limit_s, priority, "
                    "routing_reason, dispatch_attempts, created_at, updated_at) VALUES (:id, 'j', 'team-a', "
                    "'dev:alice', 'alice', :requested, :routed, :state, '', '{}', 1, 1, 1, 60, 0, '', 0, :t, :t)"),
                    {"id": job_id, "requested": requested, "routed": routed,
                     "state": "queued" if routed else "pending", "t": NOW})
    finally:
        engine.dispose()


def _read(url: str, requested: str, routed: str) -> list[tuple]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(tuple(r) for r in conn.execute(text(f"SELECT id, {requested}, {routed} FROM job")))
    finally:
        engine.dispose()


def _job_columns(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("job")}
    finally:
        engine.dispose()


def test_rename_keeps_the_values_both_ways(empty_db):
    cfg = _config(empty_db)
    command.upgrade(cfg, "0008hooks")
    _seed(empty_db)
    command.upgrade(cfg, "0009pool")
    columns = _job_columns(empty_db)
    assert {"pool", "requested_pool", "backend_job_id"} <= columns
    assert not {"backend", "requested_backend"} & columns
    assert _read(empty_db, "requested_pool", "pool") == sorted(JOBS)
    command.upgrade(cfg, "head")
    assert _diff(empty_db) == []  # the models name the new columns, and the queue index survived
    command.downgrade(cfg, "0008hooks")
    columns = _job_columns(empty_db)
    assert {"backend", "requested_backend"} <= columns and not {"pool", "requested_pool"} & columns
    assert _read(empty_db, "requested_backend", "backend") == sorted(JOBS)
    command.upgrade(cfg, "head")
    assert _read(empty_db, "requested_pool", "pool") == sorted(JOBS)
