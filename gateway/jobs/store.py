"""New jobs: the one way a job row (and its Idempotency-Key row) is created (issue #46).

Every job the gateway records enters here, with its ``submitted`` state event
(gateway/jobs/journal.py), in the caller's transaction: a single job, a batch of plain
submissions (issue #32's group commit), a keyed or dependent one, or the tasks of a job set.
:func:`insert_jobs` picks the physical form, not the caller:

* Postgres, a few rows: ONE statement over one JSON document (``:rows``, gateway/kit/bulk.py),
  jobs and events, whatever their number;
* Postgres, many rows (a job set's tasks): ``COPY`` of the jobs, then of their events
  (kit.bulk's COPY path: the values every row shares formatted once);
* SQLite: two executemany.

Changes to a job after it exists are the state machine's (gateway/jobs/service.py) and the
dispatch round's (gateway/jobs/claims.py); ``tests/layout/test_table_writers.py`` checks that
no other module creates or removes job rows.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.jobs import journal, repository
from gateway.kit import bulk
from gateway.kit.errors import Invalid
from gateway.models.jobs import IdempotencyKey, Job

TABLE = Job.__table__
# The columns a new job is written with; a job set's tasks add theirs (EXTRA_COLUMNS).
COLUMNS = ("id", "name", "account_name", "submitted_by", "username", "requested_pool", "pool", "state",
           "state_reason", "spec", "workers", "gpus_per_worker", "total_gpus", "time_limit_s", "priority",
           "routing_reason", "dispatch_attempts", "created_at", "updated_at", "lineage")
EXTRA_COLUMNS = ("job_set_id", "array_index")
# From this many rows on, Postgres streams with COPY (bench/bench_arrays.py); below, one statement.
COPY_FROM_ROWS = 500


@functools.lru_cache(maxsize=8)
def _insert_sql(dialect, columns: tuple[str, ...]) -> Any:
    """Postgres: new jobs and their ``submitted`` events in ONE statement over one JSON document,
    the events in the rows' order."""
    record = bulk.record_columns(TABLE, columns, dialect)
    cols = ", ".join(columns)
    return text(f"""WITH r AS (SELECT * FROM json_to_recordset(CAST(:rows AS json))
                               AS r({record}, actor {journal.actor_type(dialect)},
                                    event_data {journal.data_type(dialect)}, ord integer)),
new_job AS (INSERT INTO job ({cols}) SELECT {cols} FROM r ORDER BY r.ord RETURNING id)
{journal.submitted_events_sql()}""")


def insert_jobs(session: Session, rows: list[dict[str, Any]], *, shared: dict[str, Any] | None = None) -> None:
    """Write new jobs with their ``submitted`` events, in order.

    Each job is ``shared`` (the values every row has) plus its row: together the job's
    :data:`COLUMNS` (and :data:`EXTRA_COLUMNS` for a set's tasks), ``actor`` (who submitted,
    the event's actor) and optionally ``event_data`` (the event's data). JSON values are
    Python objects.

    An unknown account fails the foreign key and nothing is written: for one job that is the
    422 naming ``body.account``; for several the error propagates (a batch's caller retries
    each alone; a job set checked its account when it wrote the set row).
    """
    if not rows:
        return
    shared = shared or {}
    conn = session.connection()
    try:
        if conn.dialect.name == "postgresql" and len(rows) >= COPY_FROM_ROWS:
            _copy(conn, rows, shared)
            return
        whole = [{**shared, **row} for row in rows]
        columns = tuple(c for c in (*COLUMNS, *EXTRA_COLUMNS) if c in whole[0])
        if conn.dialect.name == "postgresql":
            conn.execute(_insert_sql(conn.dialect, columns), {"rows": bulk.document(
                [{**{c: row[c] for c in columns}, "actor": row["actor"], "event_data": row.get("event_data"),
                  "ord": i} for i, row in enumerate(whole)])})
            return
        bulk.insert_rows(conn, TABLE, [{c: row[c] for c in columns} for row in whole])
        journal.insert_many(conn, [_event(row) for row in whole])
    except IntegrityError as exc:
        if len(rows) == 1 and is_foreign_key_violation(exc):
            account = {**shared, **rows[0]}["account_name"]
            raise Invalid("body.account", f"unknown account {account!r}") from None
        raise


def _event(row: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": row["id"], "at": row["created_at"], "actor": row["actor"], "kind": "state",
            "from_state": None, "to_state": row["state"], "reason": "submitted", "data": row.get("event_data")}


def _copy(conn, rows: list[dict[str, Any]], shared: dict[str, Any]) -> None:
    """Postgres, many rows: COPY the jobs, then their events (both with the shared part once)."""
    job_shared = {k: v for k, v in shared.items() if k in TABLE.c}
    own = [c for c in rows[0] if c in TABLE.c]
    json_cols = {c for c in own if isinstance(TABLE.c[c].type, JSON)}
    bulk.insert_rows(conn, TABLE, [tuple(json.dumps(r[c]) if c in json_cols and r[c] is not None else r[c]
                                         for c in own) for r in rows], shared=job_shared, columns=own)
    at = shared.get("created_at")
    actor = shared.get("actor")
    event_shared = {"kind": "state", "from_state": None, "reason": "submitted"}
    if at is not None and actor is not None and "created_at" not in rows[0] and "actor" not in rows[0]:
        event_shared.update(at=at, actor=actor)
        cols, events = ("job_id", "to_state", "data"), [
            (r["id"], r.get("state", shared.get("state")), _json_text(r.get("event_data"))) for r in rows]
    else:
        cols, events = ("job_id", "at", "actor", "to_state", "data"), [
            (r["id"], r.get("created_at", at), r.get("actor", actor), r.get("state", shared.get("state")),
             _json_text(r.get("event_data"))) for r in rows]
    journal.copy_many(conn, event_shared, cols, events)


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def insert_with_key(session: Session, values: dict[str, Any], *, subject: str, key: str, digest: str,
                    at: datetime) -> bool:
    """A keyed job (:func:`insert_jobs` of one) and its Idempotency-Key row, under a savepoint;
    False when a concurrent request took the key first (nothing of this one is written).

    The savepoint (two extra round trips) is only paid when a unique key can collide.
    """
    try:
        with session.begin_nested():
            insert_jobs(session, [values])
            session.add(IdempotencyKey(subject=subject, key=key, request_hash=digest, job_id=values["id"],
                                       created_at=at))
            session.flush()
    except IntegrityError:
        if repository.get_idempotency(session, subject, key) is None:
            raise
        return False
    return True


def is_foreign_key_violation(exc: IntegrityError) -> bool:
    orig = exc.orig
    return getattr(orig, "sqlstate", None) == "23503" or "FOREIGN KEY constraint failed" in str(orig)
