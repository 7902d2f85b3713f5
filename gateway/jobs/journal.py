"""The job history's one writer: every ``job_event`` row is written here (issue #46).

A job's history is append-only. Whoever records something about a job (the state machine,
the dispatch round, the reconciler, a reclaim, a checkpoint report, a job set) writes its
event through this module, in the caller's transaction:

* :func:`record` adds one event through the ORM (it is flushed with the caller's other
  changes, in order);
* :func:`insert_many` writes many in one statement (Postgres) or one executemany (SQLite),
  and :func:`copy_many` streams a job set's thousands with ``COPY``;
* the dispatch round and the submission path write a state change and its event in ONE
  statement: the event halves of those statements are built here (:func:`state_values`,
  :func:`after`, :func:`values_insert`, :func:`claim_events_cte`, :func:`waiting_events_cte`,
  :func:`submitted_events_sql`), the job halves where the job's columns are written.

``tests/layout/test_table_writers.py`` checks that no other module writes the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import String, bindparam, literal, null, select
from sqlalchemy.orm import Session

from gateway.domain.states import JobState
from gateway.kit import bulk
from gateway.kit.timeutil import utcnow
from gateway.models.jobs import JobEvent

TABLE = JobEvent.__table__
COLUMNS = ["job_id", "at", "actor", "kind", "from_state", "to_state", "reason", "data"]


def record(session: Session, job_id: str, *, actor: str, kind: str, reason: str = "",
           data: dict[str, Any] | None = None, from_state: str | None = None, to_state: str | None = None,
           at: datetime | None = None) -> JobEvent:
    """One event of ``job_id``, added to the session (written at its next flush)."""
    ev = JobEvent(job_id=job_id, at=at or utcnow(), actor=actor, kind=kind, reason=reason, data=data,
                  from_state=from_state, to_state=to_state)
    session.add(ev)
    return ev


def insert_many(conn, events: list[dict[str, Any]]) -> None:
    """``events`` (dicts of :data:`COLUMNS`, the same keys each) in their order, in one statement."""
    bulk.insert_rows(conn, TABLE, events)


def copy_many(conn, shared: dict[str, Any], columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
    """Many events that share most values (a job set's ``submitted`` events): kit.bulk's COPY path."""
    bulk.insert_rows(conn, TABLE, rows, shared=shared, columns=columns)


def state_values(job_id, at, *, from_state: JobState | None, to_state: JobState, reason, data) -> list:
    """Column values (:data:`COLUMNS` order) of a ``state`` event for Core statements; the
    actor is the bound parameter ``e_actor``."""
    return [job_id, at, bindparam("e_actor", type_=String()), literal("state", type_=String()),
            literal(from_state.value, type_=String()) if from_state else null(),
            literal(to_state.value, type_=String()), reason, data]


def after(cte, job_id, at, **event):
    """``WITH cte AS (... RETURNING id) INSERT INTO job_event SELECT ...``: a write and its
    state event in one statement."""
    return TABLE.insert().from_select(COLUMNS, select(*state_values(job_id, at, **event))).add_cte(cte)


def values_insert(job_id, at, **event):
    """The state event alone, as an INSERT (SQLite's second statement of :func:`after`)."""
    return TABLE.insert().values(dict(zip(COLUMNS, state_values(job_id, at, **event), strict=True)))


def claim_events_cte(to_state: str) -> str:
    """Postgres: ``claim_events``, the state events of the rows of ``r`` that ``claimed``
    returned, in the claims' order (``r.ord``)."""
    return f"""claim_events AS (
    INSERT INTO job_event (job_id, at, actor, kind, from_state, to_state, reason, data)
    SELECT r.id, r.at, r.actor, 'state', r.from_state, '{to_state}', r.reason, r.data
    FROM r JOIN claimed ON claimed.id = r.id ORDER BY r.ord)"""


def waiting_events_cte(dialect) -> str:
    """Postgres: ``waiting_events``, the events of the JSON document ``:events`` in their order."""
    typed = bulk.record_columns(TABLE, ("job_id", "at", "actor", "kind", "reason"), dialect)
    return f"""waiting_events AS (
    INSERT INTO job_event (job_id, at, actor, kind, reason)
    SELECT e.job_id, e.at, e.actor, e.kind, e.reason
    FROM json_to_recordset(CAST(:events AS json)) AS e({typed}, ord integer)
    ORDER BY e.ord)"""


def submitted_events_sql() -> str:
    """Postgres: the ``submitted`` events of the new jobs of ``r`` that ``new_job`` returned,
    in the rows' order (``r.data``: the event's data, JSON or NULL)."""
    return """INSERT INTO job_event (job_id, at, actor, kind, from_state, to_state, reason, data)
SELECT r.id, r.created_at, r.actor, 'state', NULL, r.state, 'submitted', r.event_data
FROM r JOIN new_job ON new_job.id = r.id ORDER BY r.ord"""


def actor_type(dialect) -> str:
    return TABLE.c.actor.type.compile(dialect=dialect)


def data_type(dialect) -> str:
    return TABLE.c.data.type.compile(dialect=dialect)
