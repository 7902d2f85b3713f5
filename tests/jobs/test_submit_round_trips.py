"""What one POST /v1/jobs costs in statements (docs/jobs.md, "The submission path").

Counted on the gateway's own engine, so the count is the same on a loaded machine: the
budget verdict rides on the cap read (no chain walk, no quota read of its own).
"""

from __future__ import annotations

from sqlalchemy import event

from tests.jobs.test_api import SPEC, submit


def submission_engine(gw):
    """The engine POST /v1/jobs runs on: the async one's (Postgres), else the app's (SQLite)."""
    async_engine = getattr(gw.app.state, "async_engine", None)
    return async_engine.sync_engine if async_engine is not None else gw.app.state.engine


def engine_name(gw) -> str:
    return submission_engine(gw).dialect.name


def _statements(gw, body, **kw) -> tuple[int, list[str]]:
    engine = submission_engine(gw)
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        seen.append(" ".join(statement.split()))

    submit(gw, body, **kw)  # warm: first-use reads (e.g. settings caches) are not the hot path
    event.listen(engine, "before_cursor_execute", note)
    try:
        r = submit(gw, body, **kw)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert r.status_code == 202, r.text
    return len(seen), seen


def test_a_submission_is_one_read_and_one_write(gw):
    n, seen = _statements(gw, SPEC)
    # Postgres: the cap check's advisory locks first (issue #27 finding 3), one statement.
    locks = [s for s in seen if "pg_advisory_xact_lock" in s or s.startswith("WITH RECURSIVE cap_lock_chain(")]
    assert len(locks) == (1 if engine_name(gw) == "postgresql" else 0), seen
    seen = [s for s in seen if s not in locks]
    n -= len(locks)
    reads = [s for s in seen if s.upper().startswith(("SELECT", "WITH"))
             and "INSERT" not in s.upper()]
    writes = [s for s in seen if "INSERT" in s.upper()]
    # One read (account chain + caps + counts + budgets), then the insert of the job and its
    # event (one statement on Postgres, two on SQLite); BEGIN aside, nothing else.
    assert len(reads) == 1, seen
    assert len(writes) == (1 if engine_name(gw) == "postgresql" else 2), seen
    assert n - len([s for s in seen if s.upper().startswith("BEGIN")]) == len(reads) + len(writes), seen
