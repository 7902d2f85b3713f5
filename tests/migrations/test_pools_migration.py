"""0007pools with data in the tables (#13, 2): the two old pools become rows, per-pool columns
become rows and back, on SQLite and Postgres; the ledger's invariants hold after each step."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from tests.migrations.test_migrations import _config, _diff, empty_db  # noqa: F401  (fixture)

NOW = "2026-11-30 12:00:00"


def _seed(conn) -> None:
    """A ledger at 0006: team-a (under org) holds an 8-GPU slurm gang, per-pool limits on both pools."""
    for name, parent in (("org", None), ("team-a", "org")):
        conn.execute(text("INSERT INTO account (name, parent_name, shares, description, created_at) "
                          "VALUES (:n, :p, 1, '', :t)"), {"n": name, "p": parent, "t": NOW})
    conn.execute(text("INSERT INTO account_quota (account_name, max_gpus, max_gpus_slurm, max_gpus_kubernetes, "
                      "budget_period, budget_window_days, updated_at, updated_by) "
                      "VALUES ('org', 64, 16, 4, 'month', 30, :t, 'admin')"), {"t": NOW})
    for name in ("org", "team-a"):
        conn.execute(text("INSERT INTO account_balance (account_name, reserved_gpus, reserved_gpus_slurm, "
                          "reserved_gpus_kubernetes, committed_gpu_seconds, charged_gpu_seconds, queued_jobs, "
                          "updated_at) VALUES (:n, 8, 8, 0, 28800, 0, 1, :t)"), {"n": name, "t": NOW})
    conn.execute(text("INSERT INTO job (id, name, account_name, submitted_by, username, requested_backend, backend, "
                      "state, state_reason, spec, workers, gpus_per_worker, total_gpus, held_gpus, time_limit_s, "
                      "priority, routing_reason, dispatch_attempts, created_at, updated_at) VALUES ('j1', 'j', "
                      "'team-a', 'dev:alice', 'alice', 'auto', 'slurm', 'queued', '', '{}', 1, 8, 8, 8, 3600, 0, "
                      "'', 1, :t, :t)"), {"t": NOW})
    conn.execute(text("INSERT INTO ledger_reservation (job_id, account_name, username, pool, gpus, time_limit_s, "
                      "billing_weight, committed_gpu_seconds, status, reserved_at, used_gpu_seconds, "
                      "accrued_gpu_seconds) VALUES ('j1', 'team-a', 'alice', 'slurm', 8, 3600, 1.0, 28800, "
                      "'reserved', :t, 0, 0)"), {"t": NOW})
    conn.execute(text("INSERT INTO ledger_entry (at, account_name, kind, job_id, pool, username, gpus, "
                      "committed_gpu_seconds, gpu_seconds, billing_weight, actor, reason) VALUES (:t, 'team-a', "
                      "'reserve', 'j1', 'slurm', 'alice', 8, 28800, 0, 1.0, 'system:dispatcher', 'r')"), {"t": NOW})


def _rows(conn, sql: str) -> list[tuple]:
    return sorted(tuple(r) for r in conn.execute(text(sql)))


def _check_upgraded(url: str) -> None:
    from gateway.ledger import reading as ledger_reading
    from gateway.ledger import rules as ledger_rules

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert _rows(conn, "SELECT name, kind, state FROM pool") == [("kubernetes", "kubernetes", "active"),
                                                                        ("slurm", "slurm", "active")]
            assert _rows(conn, "SELECT account_name, pool, max_gpus FROM account_pool_quota") == [
                ("org", "kubernetes", 4), ("org", "slurm", 16)]
            assert _rows(conn, "SELECT account_name, pool, reserved_gpus FROM account_pool_balance") == [
                ("org", "slurm", 8), ("team-a", "slurm", 8)]
        with Session(engine) as s:
            assert ledger_reading.verify(s) == []
            assert ledger_rules.pool_balances(s, "org") == {"slurm": 8}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_keeps_the_data(empty_db):
    cfg = _config(empty_db)
    command.upgrade(cfg, "0006")
    engine = create_engine(empty_db)
    try:
        with engine.begin() as conn:
            _seed(conn)
    finally:
        engine.dispose()
    command.upgrade(cfg, "head")
    _check_upgraded(empty_db)
    command.downgrade(cfg, "0006")
    engine = create_engine(empty_db)
    try:
        with engine.connect() as conn:
            assert _rows(conn, "SELECT account_name, max_gpus_slurm, max_gpus_kubernetes FROM account_quota") == [
                ("org", 16, 4)]
            assert _rows(conn, "SELECT account_name, reserved_gpus_slurm, reserved_gpus_kubernetes "
                               "FROM account_balance") == [("org", 8, 0), ("team-a", 8, 0)]
            assert _rows(conn, "SELECT id, backend FROM job") == [("j1", "slurm")]
    finally:
        engine.dispose()
    command.upgrade(cfg, "head")
    _check_upgraded(empty_db)
    assert _diff(empty_db) == []
