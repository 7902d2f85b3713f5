"""Job domain logic: create (idempotently), read, list, cancel, and state changes.

``set_state`` is the only way a job's state changes; it writes the event in the same
transaction, so the history is complete.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import String, bindparam, func, literal, null, select, union
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from gateway.accounts.tree import subtree_names, up_cte, up_many_cte
from gateway.domain.shapes import parse_duration_s
from gateway.domain.states import JobState, check_transition
from gateway.identity.principal import Principal
from gateway.jobs import repository
from gateway.jobs.schemas import JobSpec
from gateway.kit import bulk
from gateway.kit.errors import (
    Conflict,
    Forbidden,
    GatewayError,
    Invalid,
    LimitExceeded,
    NotFound,
)
from gateway.kit.timeutil import new_id, utcnow
from gateway.models.accounts import Account, AccountPoolQuota, AccountQuota
from gateway.models.jobs import IdempotencyKey, Job, JobAttempt, JobEvent, WaitingCount

log = logging.getLogger("isthmus.jobs")


def record_event(session: Session, job: Job, *, actor: str, kind: str, reason: str = "",
                 data: dict[str, Any] | None = None, from_state: str | None = None,
                 to_state: str | None = None) -> JobEvent:
    ev = JobEvent(job_id=job.id, at=utcnow(), actor=actor, kind=kind, reason=reason, data=data,
                  from_state=from_state, to_state=to_state)
    session.add(ev)
    return ev


def set_state(session: Session, job: Job, target: JobState, *, actor: str, reason: str = "",
              data: dict[str, Any] | None = None) -> bool:
    """Move ``job`` to ``target`` and record why. Returns False when already there.

    Raises IllegalTransition (from the model's validator) for a move the state machine
    forbids; nothing is written then.
    """
    current = job.state
    if current == target.value:
        if reason and reason != job.state_reason:
            job.state_reason = reason
        return False
    job.state = target.value  # validated against the transition table
    job.state_reason = reason
    job.updated_at = utcnow()
    record_event(session, job, actor=actor, kind="state", reason=reason, data=data,
                 from_state=current, to_state=target.value)
    log.info("%s -> %s: %s", current, target.value, reason,
             extra={"job_id": job.id, "account": job.account_name, "pool": job.pool or "", "actor": actor})
    if target.final or target is JobState.RUNNING:
        # Dependencies and array slots (gateway/flows): what waits for this job moves on
        # in this same transaction. The one hook of workflows into the state machine.
        from gateway.jobs.graph import after_transition

        after_transition(session, job, target, set_state=set_state)
    return True


_JOB_T = Job.__table__
_EVENT_T = JobEvent.__table__
_SUBMITTED_UPDATE = (
    _JOB_T.update()
    .where(_JOB_T.c.id == bindparam("job_id"), _JOB_T.c.state == JobState.DISPATCHING.value,
           _JOB_T.c.backend_job_id.is_(None))
    .values(state=JobState.QUEUED.value, state_reason=bindparam("reason"), backend_job_id=bindparam("backend_job_id"),
            next_attempt_at=None, updated_at=bindparam("now"))
)
_EVENT_COLS = ["job_id", "at", "actor", "kind", "from_state", "to_state", "reason", "data"]


def _state_event(job_id, at, *, from_state: JobState | None, to_state: JobState, reason, data) -> list:
    """Column values (``_EVENT_COLS`` order) of a ``state`` event for the Core write paths."""
    return [job_id, at, bindparam("e_actor", type_=String()), literal("state", type_=String()),
            literal(from_state.value, type_=String()) if from_state else null(),
            literal(to_state.value, type_=String()), reason, data]


def _event_after(cte, job_id, at, **event):
    """``WITH cte AS (... RETURNING id) INSERT INTO job_event SELECT ...``: a write and its event in one statement."""
    return _EVENT_T.insert().from_select(_EVENT_COLS, select(*_state_event(job_id, at, **event))).add_cte(cte)


def _event_insert(job_id, at, **event):
    return _EVENT_T.insert().values(dict(zip(_EVENT_COLS, _state_event(job_id, at, **event), strict=True)))


_SUBMITTED = dict(from_state=JobState.DISPATCHING, to_state=JobState.QUEUED, reason=bindparam("reason", type_=String()),
                  data=bindparam("data", type_=_EVENT_T.c.data.type))
_SUBMITTED_CTE = _SUBMITTED_UPDATE.returning(_JOB_T.c.id).cte("submitted_job")
_MARK_SUBMITTED_PG = _event_after(_SUBMITTED_CTE, _SUBMITTED_CTE.c.id, bindparam("now"), **_SUBMITTED).returning(
    _EVENT_T.c.job_id)
_SUBMITTED_EVENT = _event_insert(bindparam("job_id"), bindparam("now"), **_SUBMITTED)
check_transition(JobState.DISPATCHING, JobState.QUEUED)  # the guarded write's change, from the table


def record_submission(session: Session, *, job_id: str, backend_job_id: str, actor: str, reason: str,
                      data: dict[str, Any]) -> bool:
    """Record a submission the backend accepted: ``dispatching`` -> ``queued`` with its job id.

    The one path for it. The dispatcher's hot path (bench/bench_dispatch.py): the guarded
    write (only from ``dispatching`` with no backend id yet; the change is the table's,
    checked at import) and its event, one statement on Postgres, without loading the job.
    When the job is elsewhere, it is loaded and locked: still ``dispatching`` (its backend
    id already recorded) it becomes ``queued`` through :func:`set_state`; cancelled
    meanwhile, it keeps its state and gets an event. Returns whether the job is final (the
    caller cancels the backend job).
    """
    conn = session.connection()
    params = {"job_id": job_id, "backend_job_id": backend_job_id, "e_actor": actor, "reason": reason, "data": data,
              "now": utcnow()}
    if conn.dialect.name == "postgresql":
        done = conn.execute(_MARK_SUBMITTED_PG, params).first() is not None
    else:
        done = conn.execute(_SUBMITTED_UPDATE, params).rowcount == 1
        if done:
            conn.execute(_SUBMITTED_EVENT, params)
    if done:
        log.info("dispatching -> queued: %s", reason, extra={"job_id": job_id, "backend_job_id": backend_job_id,
                                                                "actor": actor})
        return False
    job = session.get(Job, job_id, with_for_update=True)
    job.backend_job_id = backend_job_id
    job.next_attempt_at = None
    if job.state == JobState.DISPATCHING.value:
        set_state(session, job, JobState.QUEUED, actor=actor, reason=reason, data=data)
        return False
    record_event(session, job, actor=actor, kind="submitted", reason=f"{reason}; cancelling it")
    return JobState(job.state).final


# ------------------------------------------------------------ named transitions
# The dispatcher changes a job only through these (gateway/dispatch/): each says which
# fields move together with the state, so no caller sets half of them.

_WAIT_TAIL = " (fair-share position"


def claim(session: Session, job: Job, *, pool: str, held_gpus: int, reason: str, lease_until: datetime,
          actor: str, data: dict[str, Any] | None = None, borrowed: bool | None = None,
          backend_reservation: str | None = None) -> None:
    """``pending`` -> ``dispatching`` on ``pool``, holding ``held_gpus``, leased until ``lease_until``.

    A batch of one of :class:`Claims` (the dispatch round's writer): one implementation.
    """
    writes = Claims(session)
    writes.claim(job, pool=pool, held_gpus=held_gpus, reason=reason, lease_until=lease_until, actor=actor, data=data,
                 borrowed=borrowed, backend_reservation=backend_reservation)
    writes.flush()


_CLAIM_COLS = ("pool", "held_gpus", "borrowed", "backend_reservation", "routing_reason", "next_attempt_at", "dispatch_attempts",
               "estimated_start", "estimated_pool", "estimate_reason", "state", "state_reason", "updated_at")
# Guarded by the state the round read (the row is locked by the pick): a claim never lands twice.
_CLAIM_UPDATE = (_JOB_T.update().where(_JOB_T.c.id == bindparam("c_id"), _JOB_T.c.state == bindparam("c_from"))
                 .values({c: bindparam(f"c_{c}", type_=_JOB_T.c[c].type) for c in _CLAIM_COLS}))


# Postgres: the claims and their events in ONE statement over one JSON document (the routing
# reason, ~500 characters with 10 pools, is sent once for routing_reason, state_reason and the
# event). The events follow the claims' order (``ord``), as their ids did.
_CLAIM_RECORD = (("id", _JOB_T, "id"), ("from_state", _JOB_T, "state"), ("pool", _JOB_T, "pool"),
                 ("held_gpus", _JOB_T, "held_gpus"), ("borrowed", _JOB_T, "borrowed"),
                 ("backend_reservation", _JOB_T, "backend_reservation"), ("reason", _JOB_T, "state_reason"),
                 ("next_attempt_at", _JOB_T, "next_attempt_at"), ("dispatch_attempts", _JOB_T, "dispatch_attempts"),
                 ("at", _EVENT_T, "at"), ("actor", _EVENT_T, "actor"), ("data", _EVENT_T, "data"))


def _claims_ctes(dialect) -> str:
    """``claimed`` (the claimed jobs' ids) and their events, over the document ``:rows``."""
    record = ", ".join(f"{name} {table.c[col].type.compile(dialect=dialect)}" for name, table, col in _CLAIM_RECORD)
    to = JobState.DISPATCHING.value
    return f"""
r AS (SELECT * FROM json_to_recordset(CAST(:rows AS json)) AS r({record}, ord integer)),
claimed AS (
    UPDATE job SET pool = r.pool, held_gpus = r.held_gpus, borrowed = r.borrowed,
        backend_reservation = r.backend_reservation, routing_reason = r.reason,
        next_attempt_at = r.next_attempt_at, dispatch_attempts = r.dispatch_attempts, estimated_start = NULL,
        estimated_pool = NULL, estimate_reason = NULL, state = '{to}', state_reason = r.reason, updated_at = r.at
    FROM r WHERE job.id = r.id AND job.state = r.from_state
    RETURNING job.id),
claim_events AS (
    INSERT INTO job_event (job_id, at, actor, kind, from_state, to_state, reason, data)
    SELECT r.id, r.at, r.actor, 'state', r.from_state, '{to}', r.reason, r.data
    FROM r JOIN claimed ON claimed.id = r.id ORDER BY r.ord)"""


_NOTE_COLS = ("state_reason", "estimated_start", "estimated_pool", "estimate_reason", "updated_at")
_NOTE_UPDATE = (_JOB_T.update().where(_JOB_T.c.id == bindparam("n_id"), _JOB_T.c.state == bindparam("n_from_state"))
                .values({c: bindparam(f"n_{c}", type_=_JOB_T.c[c].type) for c in _NOTE_COLS}))


def _notes_ctes(dialect) -> str:
    """``noted`` (the noted pending jobs' ids) and their ``waiting`` events (in the order noted),
    over the documents ``:notes`` and ``:events``."""
    def typed(table, names):
        return ", ".join(f"{n} {table.c[n].type.compile(dialect=dialect)}" for n in names)

    # The guard compares with the record's from_state, not a constant: with state = 'pending'
    # (100,000 rows) a planner whose statistics lag chose to scan them all and hash-join.
    return f"""
noted AS (
    UPDATE job SET {", ".join(f"{c} = n.{c}" for c in _NOTE_COLS)}
    FROM json_to_recordset(CAST(:notes AS json)) AS n({typed(_JOB_T, ("id", *_NOTE_COLS))}, from_state VARCHAR(16))
    WHERE job.id = n.id AND job.state = n.from_state
    RETURNING job.id),
waiting_events AS (
    INSERT INTO job_event (job_id, at, actor, kind, reason)
    SELECT e.job_id, e.at, e.actor, e.kind, e.reason
    FROM json_to_recordset(CAST(:events AS json)) AS e({typed(_EVENT_T, ("job_id", "at", "actor", "kind", "reason"))},
                                                      ord integer)
    ORDER BY e.ord)"""


@functools.lru_cache(maxsize=8)
def _flush_sql(dialect, claims: bool, notes: bool) -> Any:
    """Postgres: a round's claims, its notes, or both, with their events, in ONE statement.

    Returns (jobs claimed, jobs noted). The two never touch the same job (Claims.flush checks).
    """
    from sqlalchemy import text

    ctes = ([_claims_ctes(dialect)] if claims else []) + ([_notes_ctes(dialect)] if notes else [])
    counts = ", ".join(f"(SELECT count(*) FROM {name})" if on else "0"
                       for name, on in (("claimed", claims), ("noted", notes)))
    return text(f"WITH {','.join(ctes)}\nSELECT {counts}")


def _show(job: Job, values: dict[str, Any]) -> None:
    """The loaded object shows what the round writes itself, as committed values: nothing is
    left for the ORM to flush. A job with no pending change and none of these attributes
    expired (every job a round picked) takes them into its instance dict at once (public
    ``InstanceState.dict``); any other through ``set_committed_value``, key by key (about
    ten times slower: bench/bench_dispatch_round.py)."""
    state = instance_state(job)
    if state.modified or not state.expired_attributes.isdisjoint(values):
        for key, value in values.items():
            set_committed_value(job, key, value)
    else:
        state.dict.update(values)


class Claims:
    """The one writer of claims, waiting notes and estimates: a dispatch round's many jobs, or
    one (:func:`claim`, :func:`note_waiting`, :func:`note_estimate` are batches of one).

    Each call shows its values on the loaded job at once (the round reads them back); :meth:`flush`
    checks every state change against the transition table (``states.check_transition``,
    raising IllegalTransition before anything is written) and writes them all together.
    Through the ORM, every claimed job cost an UPDATE and an event INSERT of its own, and
    their unit-of-work bookkeeping was most of a round's time (bench/bench_dispatch_round.py).
    Postgres: one statement; SQLite: an executemany UPDATE and the events' INSERT. A job the
    ORM changed earlier in the transaction is flushed first, so the write sees it.
    """

    def __init__(self, session: Session):
        self.session = session
        # One time for the round's claims (one transaction): the planner's releases of the
        # gangs claimed together are then one row per pool, not one per gang.
        self._at: datetime | None = None
        self._claims: list[dict[str, Any]] = []
        self._noted: dict[str, Job] = {}  # jobs whose reason or estimate moved
        self._waiting_events: list[dict[str, Any]] = []

    def _ready(self, job: Job) -> None:
        # Changed through the ORM earlier in this transaction: written first, so no change is
        # lost and the guarded write below compares with what the row holds.
        if instance_state(job).modified:
            self.session.flush()

    def note_waiting(self, job: Job, *, reason: str, actor: str) -> None:
        """Keep the latest 'why is my job not running' on the job; a ``waiting`` event when it changes.

        The fair-share position alone changing is not a new reason worth an event.
        """
        if job.state_reason == reason:
            return
        self._ready(job)
        if job.state_reason.split(_WAIT_TAIL)[0] != reason.split(_WAIT_TAIL)[0]:
            self._waiting_events.append(dict(job_id=job.id, at=utcnow(), actor=actor, kind="waiting", reason=reason,
                                             ord=len(self._waiting_events)))
        set_committed_value(job, "state_reason", reason)
        self._noted[job.id] = job

    def note_estimate(self, job: Job, *, start: datetime | None, pool: str | None, reason: str) -> None:
        """A pending job's planned start (or None, with why), as the last dispatch round saw it.

        Written only when it moves (by more than a few seconds), so a round does not rewrite
        every waiting row.
        """
        if not _estimate_moved(job, start=start, pool=pool, reason=reason):
            return
        self._ready(job)
        _show(job, {"estimated_start": start, "estimated_pool": pool, "estimate_reason": reason})
        self._noted[job.id] = job

    def claim(self, job: Job, *, pool: str, held_gpus: int, reason: str, lease_until: datetime, actor: str,
              data: dict[str, Any] | None = None, borrowed: bool | None = None,
              backend_reservation: str | None = None) -> None:
        """``pending`` -> ``dispatching`` on ``pool``, holding ``held_gpus``, leased until ``lease_until``;
        ``borrowed``: whether the attempt runs beyond every guarantee (None: none is set anywhere);
        ``backend_reservation``: the backend's own reservation it runs in (None: open capacity)."""
        self._ready(job)
        current = job.state
        now = self._at = self._at or utcnow()
        values = dict(pool=pool, held_gpus=held_gpus, borrowed=borrowed, backend_reservation=backend_reservation,
                      routing_reason=reason,
                      next_attempt_at=lease_until,
                      dispatch_attempts=job.dispatch_attempts + 1, estimated_start=None, estimated_pool=None,
                      estimate_reason=None, state=JobState.DISPATCHING.value, state_reason=reason, updated_at=now)
        self._claims.append(dict(id=job.id, from_state=current, pool=pool, held_gpus=held_gpus, borrowed=borrowed,
                                 backend_reservation=backend_reservation, reason=reason,
                                 next_attempt_at=lease_until, dispatch_attempts=values["dispatch_attempts"], at=now,
                                 actor=actor, data=data, ord=len(self._claims)))
        _show(job, values)
        log.info("%s -> %s: %s", current, JobState.DISPATCHING.value, reason,
                 extra={"job_id": job.id, "account": job.account_name, "pool": pool, "actor": actor})

    def flush(self) -> None:
        """Write the claims and notes (Postgres: one statement; SQLite: a few).

        Raises IllegalTransition, having written nothing, when a claim's state change is not
        in the transition table; Conflict when a row changed under the round.
        """
        claims, self._claims = self._claims, []
        noted, events, self._noted, self._waiting_events = self._noted, self._waiting_events, {}, []
        if not claims and not noted:
            return
        for current in {c["from_state"] for c in claims}:  # the state machine, checked in bulk
            check_transition(JobState(current), JobState.DISPATCHING)
        now = utcnow()
        notes = []
        for job in noted.values():  # reason, estimate, and updated_at as the ORM's onupdate sets it
            _show(job, {"updated_at": now})
            notes.append(dict(id=job.id, state_reason=job.state_reason, estimated_start=job.estimated_start,
                              estimated_pool=job.estimated_pool, estimate_reason=job.estimate_reason, updated_at=now,
                              from_state=job.state))
        conn = self.session.connection()
        if conn.dialect.name == "postgresql":
            if noted.keys() & {c["id"] for c in claims}:  # one statement may update a row once
                raise ValueError("a job was both claimed and noted in one round")
            claimed, done = conn.execute(_flush_sql(conn.dialect, bool(claims), bool(notes)), {
                "rows": bulk.document(claims), "notes": bulk.document(notes),
                "events": bulk.document(events)}).one()
        else:
            claimed = self._claims_sqlite(conn, claims)
            done = self._notes_sqlite(conn, notes, events)
        counted = conn.dialect.name == "postgresql" or conn.dialect.supports_sane_multi_rowcount
        if counted and claimed != len(claims):
            raise Conflict(f"{len(claims) - claimed} of {len(claims)} claimed jobs changed during the dispatch "
                           "round; retry")
        if counted and done != len(notes):
            raise Conflict(f"{len(notes) - done} of {len(notes)} waiting jobs changed during the dispatch round; retry")

    @staticmethod
    def _notes_sqlite(conn, notes: list[dict[str, Any]], events: list[dict[str, Any]]) -> int:
        if not notes:
            return 0
        done = conn.execute(_NOTE_UPDATE, [{f"n_{k}": v for k, v in r.items()} for r in notes]).rowcount
        bulk.insert_rows(conn, _EVENT_T, [{k: v for k, v in e.items() if k != "ord"} for e in events])
        return done

    @staticmethod
    def _claims_sqlite(conn, claims: list[dict[str, Any]]) -> int:
        if not claims:
            return 0
        done = conn.execute(_CLAIM_UPDATE, [
            {"c_id": c["id"], "c_from": c["from_state"], "c_pool": c["pool"], "c_held_gpus": c["held_gpus"],
             "c_borrowed": c["borrowed"], "c_backend_reservation": c["backend_reservation"],
             "c_routing_reason": c["reason"], "c_next_attempt_at": c["next_attempt_at"],
             "c_dispatch_attempts": c["dispatch_attempts"], "c_estimated_start": None, "c_estimated_pool": None,
             "c_estimate_reason": None, "c_state": JobState.DISPATCHING.value, "c_state_reason": c["reason"],
             "c_updated_at": c["at"]} for c in claims]).rowcount
        bulk.insert_rows(conn, _EVENT_T, [
            dict(job_id=c["id"], at=c["at"], actor=c["actor"], kind="state", reason=c["reason"], data=c["data"],
                 from_state=c["from_state"], to_state=JobState.DISPATCHING.value) for c in claims])
        return done


def note_estimate(job: Job, *, start: datetime | None, pool: str | None, reason: str) -> None:
    """:meth:`Claims.note_estimate` of one loaded job (a batch of one)."""
    writes = Claims(object_session(job))
    writes.note_estimate(job, start=start, pool=pool, reason=reason)
    writes.flush()


def _estimate_moved(job: Job, *, start: datetime | None, pool: str | None, reason: str) -> bool:
    old = job.estimated_start
    if old is not None and old.tzinfo is None:
        old = old.replace(tzinfo=UTC)
    same_start = (old is None and start is None) or (
        old is not None and start is not None and abs((old - start).total_seconds()) < 5)
    return not (same_start and job.estimated_pool == pool and job.estimate_reason == reason)


def renew_lease(session: Session, job: Job, *, until: datetime, actor: str, reason: str) -> None:
    """A dispatcher re-drives an expired claim: it holds the claim until ``until``."""
    job.next_attempt_at = until
    record_event(session, job, actor=actor, kind="recovery", reason=reason)


def note_waiting(session: Session, job: Job, *, reason: str, actor: str) -> None:
    """:meth:`Claims.note_waiting` of one job (a batch of one)."""
    writes = Claims(session)
    writes.note_waiting(job, reason=reason, actor=actor)
    writes.flush()


def return_to_pending(session: Session, job: Job, *, retry_at: datetime, actor: str, reason: str) -> None:
    """``dispatching`` -> ``pending`` (its pool dropped), retried from ``retry_at``."""
    set_state(session, job, JobState.PENDING, actor=actor, reason=reason)
    job.pool = None
    job.next_attempt_at = retry_at


def defer_retry(session: Session, job: Job, *, retry_at: datetime, actor: str, reason: str) -> None:
    """No state change; the next attempt at this job waits until ``retry_at``."""
    record_event(session, job, actor=actor, kind="retry", reason=reason)
    job.next_attempt_at = retry_at


def observe(job: Job, *, backend_job_id: str | None = None, nodes: list[str] | None = None) -> None:
    """Record the backend's id (once) and the nodes a backend reports for the job."""
    if backend_job_id and not job.backend_job_id:
        job.backend_job_id = backend_job_id
    if nodes:
        job.nodes = list(nodes)


def note_backend(session: Session, job: Job, *, reason: str, actor: str, data: dict[str, Any]) -> bool:
    """The backend's words changed while the state did not: keep them, with an event."""
    if reason == job.state_reason:
        return False
    record_event(session, job, actor=actor, kind="backend", reason=reason, data=data)
    job.state_reason = reason
    return True


def mark_started(job: Job, started_at: datetime | None) -> None:
    """The current run's start (None: not known)."""
    job.started_at = started_at


def clear_run(job: Job) -> None:
    """The gang was taken down (requeue): the next ``running`` records the new start."""
    job.started_at = None


def end_attempt(session: Session, job: Job, *, outcome: str, started_at: datetime | None, ended_at: datetime,
                exit_code: int | None, backend_reason: str, charged_gpu_seconds: int) -> JobAttempt:
    """Record the job's current attempt as ended (a ``job_attempt`` row: pool, backend job,
    nodes, times, why, what its run was charged) and move the job to its next attempt number."""
    attempt = JobAttempt(job_id=job.id, number=job.attempt, pool=job.pool, backend_job_id=job.backend_job_id,
                         nodes=list(job.nodes) if job.nodes else None, started_at=started_at, ended_at=ended_at,
                         outcome=outcome, exit_code=exit_code, reason=backend_reason,
                         charged_gpu_seconds=int(charged_gpu_seconds))
    session.add(attempt)
    job.attempt += 1
    return attempt


def retry(session: Session, job: Job, *, outcome: str, started_at: datetime | None, ended_at: datetime,
          exit_code: int | None, backend_reason: str, charged_gpu_seconds: int, actor: str, reason: str,
          data: dict[str, Any] | None = None) -> JobAttempt:
    """End the job's current attempt and queue the next one in the gateway (docs/recovery.md).

    The ended attempt becomes a ``job_attempt`` row (:func:`end_attempt`); the job goes back
    to ``pending`` with its next attempt number and nothing of the old run (pool, backend
    job, nodes, start): routing and admission decide afresh, and the job keeps its id, so
    its place in line (priority, then age) and its checkpoint lineage.
    """
    attempt = end_attempt(session, job, outcome=outcome, started_at=started_at, ended_at=ended_at,
                          exit_code=exit_code, backend_reason=backend_reason, charged_gpu_seconds=charged_gpu_seconds)
    job.pool = job.backend_job_id = job.nodes = job.started_at = job.exit_code = job.held_gpus = None
    job.borrowed = None
    job.dispatch_attempts, job.next_attempt_at = 0, None
    set_state(session, job, JobState.PENDING, actor=actor, reason=reason,
              data={**(data or {}), "attempt": attempt.number, "outcome": outcome})
    return attempt


def attempts_of(session: Session, job_id: str) -> list[JobAttempt]:
    """The job's ended attempts, oldest first."""
    return list(session.scalars(select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.number)))


def finish(session: Session, job: Job, target: JobState, *, ended_at: datetime, actor: str, reason: str,
           exit_code: int | None = None, data: dict[str, Any] | None = None) -> None:
    """Move to the final state ``target`` at ``ended_at``, with the exit code the job reports."""
    if not target.final:
        raise ValueError(f"{target.value} is not a final state")
    job.exit_code = exit_code
    job.ended_at = ended_at
    job.next_attempt_at = None
    set_state(session, job, target, actor=actor, reason=reason, data=data)


def final_exit_code(target: JobState, exit_code: int | None) -> int | None:
    """The exit code a finished job reports: a cancelled job has none unless it really exited non-zero.

    Slurm reports 0 for a job whose steps it killed on cancel; showing that as "exit code 0"
    would claim the command succeeded. A signal (128 + n) or a real failure code is kept.
    """
    if target is JobState.CANCELLED and not exit_code:
        return None
    return exit_code


def spec_hash(spec: JobSpec) -> str:
    canonical = json.dumps(spec.stored(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class SubmitCaps:
    """Site defaults of the caps checked at submit (settings ``max_pending_*``, ``max_idempotency_*``)."""

    pending_per_user: int
    pending_per_account: int
    keys_per_user: int
    key_window_s: int = 86400


# A job counts against the pending caps until its gang starts (a blocked one too: it is a row
# waiting to run, and an array's tasks count one each).
WAITING_STATES = tuple(s.value for s in (JobState.BLOCKED, JobState.PENDING, JobState.DISPATCHING, JobState.QUEUED, JobState.REQUEUED))

_KEY_C = IdempotencyKey.__table__.c
_WC = WaitingCount.__table__.c


def _waiting(*where):
    """How many jobs wait to start, summed from the counters the triggers keep (migration
    0014waiting): a few rows per account and user, whatever the history or the queue."""
    return select(func.coalesce(func.sum(_WC.n), 0)).where(*where).scalar_subquery()


def _count_upto(table, limit, *where):
    """COUNT of at most ``limit`` rows: the cost is bounded by the cap, never a table scan."""
    return select(func.count()).select_from(select(literal(1)).select_from(table).where(*where)
                                            .limit(limit).subquery()).scalar_subquery()


# One read in the common case: the account's chain (leaf first) with the admin-set caps,
# plus the counts the site defaults need (Postgres runs each uncorrelated count once).
_CAP_UP = up_cte("cap_chain")
_CAP_READ = (
    select(_CAP_UP.c.name, AccountQuota.max_queued_jobs, AccountQuota.max_queued_jobs_per_user,
           # The GPU-hour budgets ride along: the submit path's budget verdict needs no read
           # of its own (gateway.ledger.service.budget_verdict_of).
           AccountQuota.budget_gpu_seconds, AccountQuota.budget_period, AccountQuota.budget_window_days,
           # So do the concurrent-GPU limits' presence (the never-admissible check at submit
           # reads them only when one is set: jobs.admission.refuse_if_never_admissible).
           AccountQuota.max_gpus,
           select(literal(1)).where(AccountPoolQuota.account_name == _CAP_UP.c.name,
                                    AccountPoolQuota.max_gpus.is_not(None)).exists().label("has_pool_limits"),
           _waiting(_WC.username == bindparam("username")).label("n_user"),
           _waiting(_WC.account_name == bindparam("leaf")).label("n_account"),
           _count_upto(IdempotencyKey.__table__, bindparam("cap_keys"), _KEY_C.subject == bindparam("subject"),
                       _KEY_C.created_at > bindparam("keys_since")).label("n_keys"))
    .select_from(_CAP_UP.outerjoin(AccountQuota, AccountQuota.account_name == _CAP_UP.c.name))
    .order_by(_CAP_UP.c.depth)
)
_HINT = "wait for jobs to start or cancel some"

# Postgres: the cap check's serialisation (issue #27 finding 3). Transaction-scoped advisory
# locks, held until the submissions commit, so a later transaction counts only after the
# earlier one's jobs are visible: the users' (the per-user caps span every account), then
# the roots of the accounts' trees (every account cap, on the account or an ancestor,
# counts inside that tree). One statement takes every lock a transaction needs (a batch of
# submissions: several users and trees) in one global order, users before trees and each
# kind by key, so two transactions never wait for each other both ways; nothing else takes
# these locks. The order is fixed by the sorted sub-select the locks are taken over, not by
# the order a select list happens to be evaluated in. Keys are a stable hash of namespaced
# names; a collision only serialises two unrelated submissions.
_LOCK_UP = up_many_cte("cap_lock_chain", bindparam("leaves", expanding=True))
_LOCK_USERS = func.unnest(bindparam("users", type_=ARRAY(String))).table_valued("u").render_derived(name="lock_users")
_LOCK_KEYS = union(
    select(literal(0).label("kind"), func.hashtextextended(
        literal("isthmus.caps.user:", String) + _LOCK_USERS.c.u, 0).label("k")).select_from(_LOCK_USERS),
    select(literal(1), func.hashtextextended(literal("isthmus.caps.account:", String) + _LOCK_UP.c.name, 0))
    .where(_LOCK_UP.c.parent.is_(None)),
).subquery("lock_keys")
_LOCK_ORDER = select(_LOCK_KEYS.c.k).order_by(_LOCK_KEYS.c.kind, _LOCK_KEYS.c.k).offset(0).subquery("lock_order")
_CAP_LOCK = select(func.pg_advisory_xact_lock(_LOCK_ORDER.c.k))


def lock_caps(session: Session, pairs) -> None:
    """Postgres: take the cap locks of every ``(account, username)`` about to be counted, held
    to the end of the transaction (one statement, see ``_CAP_LOCK``). SQLite serialises
    writers itself."""
    if session.get_bind().dialect.name != "postgresql":
        return
    pairs = list(pairs)
    session.connection().execute(_CAP_LOCK, {"leaves": sorted({a for a, _ in pairs}),
                                             "users": sorted({u for _, u in pairs})})


@dataclasses.dataclass
class CapRead:
    """One read of an account chain's caps and the counts they limit (:func:`read_caps`).

    ``counts`` maps a counter (``("user", name)``, ``("account", name)``, ``("tree", name)``,
    ``("tree_user", name, user)``, ``("keys", subject)``) to what the database held;
    ``checks`` are the limits on them in the order they are judged; ``touches`` the counters
    one more job of this account and user adds to.
    """

    chain: list[Any]
    counts: dict[tuple, int]
    checks: list[tuple[tuple, int, str, bool]]  # counter, limit, message with {n}, hinted
    touches: tuple[tuple, ...]
    key_counter: tuple | None


class CapTally(collections.Counter):
    """What a transaction admitted since it read the counts: a batch's earlier members."""


def read_caps(session: Session, *, account: str, username: str, subject: str, caps: SubmitCaps,
              with_key: bool, now=None) -> CapRead | None:
    """The caps on ``account``'s chain and the counts they limit; None for an unknown account.

    One round trip unless an admin set a cap on the account or an ancestor (then two).
    The pending counts are read from ``waiting_count``, which triggers keep in each writer's
    transaction (issue #32): a few rows per account and user, so the cost does not grow
    with the jobs that wait or with history. The idempotency-key count is an index range
    scan stopped at its cap. Counts are only exact under the locks of :func:`lock_caps`.
    """
    now = now or utcnow()
    # Without a key, "since" is in the future: the key count is an empty index probe.
    since = now - timedelta(seconds=caps.key_window_s) if with_key else now + timedelta(days=1)
    chain = session.connection().execute(_CAP_READ, {"leaf": account, "username": username, "subject": subject,
                                        "cap_user": caps.pending_per_user, "cap_account": caps.pending_per_account,
                                        "cap_keys": caps.keys_per_user, "keys_since": since}).all()
    if not chain:
        return None  # unknown account
    first = chain[0]
    user, own = ("user", username), ("account", account)
    counts = {user: first.n_user, own: first.n_account}
    checks: list[tuple[tuple, int, str, bool]] = [
        (user, caps.pending_per_user, (f"user {username} has {{n}} of {caps.pending_per_user} pending jobs allowed "
                                       f"per user (ISTHMUS_MAX_PENDING_JOBS_PER_USER)"), True)]
    if all(row.max_queued_jobs is None for row in chain):
        checks.append((own, caps.pending_per_account, (f"{account}: {{n}} of {caps.pending_per_account} pending jobs "
                                                       f"allowed per account (ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT)"),
                       True))
    subtree: list[tuple[Any, tuple, int, str]] = []
    for i, row in enumerate(chain):
        if row.max_queued_jobs is None and row.max_queued_jobs_per_user is None:
            continue  # no admin-set cap here: no subtree to build (the common case)
        in_subtree = _WC.account_name.in_(subtree_names(row.name, name=f"cap_sub_{i}"))  # caps the subtree
        if row.max_queued_jobs is not None:
            subtree.append((_waiting(in_subtree), ("tree", row.name), row.max_queued_jobs,
                            (f"{row.name}: {{n}} of {row.max_queued_jobs} pending jobs (max_queued_jobs of "
                             f"{row.name})")))
        if row.max_queued_jobs_per_user is not None:
            subtree.append((_waiting(in_subtree, _WC.username == username), ("tree_user", row.name, username),
                            row.max_queued_jobs_per_user,
                            (f"{row.name}: user {username} has {{n}} of {row.max_queued_jobs_per_user} pending jobs "
                             f"(max_queued_jobs_per_user of {row.name})")))
    if subtree:
        for n, (_, counter, limit, message) in zip(session.execute(select(*[q for q, *_ in subtree])).one(), subtree, strict=True):
            counts[counter] = n
            checks.append((counter, limit, message, True))
    key_counter = None
    if with_key:
        key_counter = ("keys", subject)
        counts[key_counter] = first.n_keys
        checks.append((key_counter, caps.keys_per_user,
                       (f"{{n}} of {caps.keys_per_user} new idempotency keys allowed per caller in "
                        f"{caps.key_window_s} s (ISTHMUS_MAX_IDEMPOTENCY_KEYS_PER_USER); replays of existing keys "
                        f"still work"), False))
    touches = (user, own, *(c for row in chain for c in (("tree", row.name), ("tree_user", row.name, username))))
    return CapRead(chain=chain, counts=counts, checks=checks, touches=touches, key_counter=key_counter)


def admit(read: CapRead, tally: CapTally, *, adding: int = 1) -> None:
    """THE cap rule: refuse ``adding`` more jobs (and, when read with a key, one new key) that
    would pass a cap, counting what was read plus what ``tally`` says this transaction
    admitted since; else add them to ``tally``. Every entry point judges through here.

    Raises:
        LimitExceeded: 429 whose detail names the limit; ``tally`` is unchanged.
    """
    hint = _HINT if adding == 1 else f"this request adds {adding}; {_HINT}"
    for counter, limit, message, hinted in read.checks:
        n = read.counts[counter] + tally[counter]
        if n + (1 if counter == read.key_counter else adding) > limit:
            raise LimitExceeded(message.format(n=n) + (f"; {hint}" if hinted else ""))
    for counter in read.touches:
        tally[counter] += adding
    if read.key_counter is not None:
        tally[read.key_counter] += 1


def check_caps(session: Session, *, account: str, username: str, subject: str, caps: SubmitCaps,
               with_key: bool, now=None, adding: int = 1) -> list[Any]:
    """Refuse a submission that would exceed a cap (issue #12 finding 10, issue #15): the
    locks (:func:`lock_caps`), the read (:func:`read_caps`) and the rule (:func:`admit`) for
    one request. ``adding`` jobs are about to be written (an array's tasks).

    Returns:
        The account chain read, leaf first (name, caps, GPU-hour budget); empty for an
        unknown account.

    Raises:
        LimitExceeded: 429 whose detail names the limit.
    """
    lock_caps(session, [(account, username)])
    read = read_caps(session, account=account, username=username, subject=subject, caps=caps, with_key=with_key,
                     now=now)
    if read is None:
        return []  # unknown account: the insert refuses it with its own message
    admit(read, CapTally(), adding=adding)
    return read.chain


def check_caller(principal: Principal, account: str) -> None:
    """Who may record jobs for ``account``: a member (or an admin) with a POSIX user to run as.

    The one rule for single jobs and job sets (gateway/flows/service.py). Raises Forbidden.
    """
    if not principal.may_use(account):
        raise Forbidden(f"you are not a member of account {account!r}")
    if not principal.username:
        raise Forbidden("this caller has no POSIX user mapped; jobs cannot run as it")


def time_limit_of(time_limit: str | None, *, default_s: int, max_s: int) -> int:
    """A job's time limit in seconds: the spec's, else the site default; never above the site maximum."""
    time_limit_s = parse_duration_s(time_limit) if time_limit else default_s
    if time_limit_s > max_s:
        raise Invalid("body.time_limit", f"exceeds this gateway's maximum of {max_s} s")
    return time_limit_s


class RefusedWhileWriting(Exception):
    """A submission refused after part of it was written (:func:`create_many`): its
    transaction must be rolled back. ``refusal`` is the answer the request gets."""

    def __init__(self, refusal: GatewayError):
        super().__init__(str(refusal))
        self.refusal = refusal


@dataclasses.dataclass
class Submission:
    """One job to record (:func:`create_many`): who asks, what, with which Idempotency-Key.

    ``lineage``: the checkpoint lineage of a job resuming an earlier one's (admission's
    ``checkpoint_lineage``); a job with a checkpoint and none starts its own (its id).
    ``hold`` gets the account chain the cap check read, root first, and returns why the job
    is held (its state reason becomes "held: ..."), or None; it may raise to refuse. A
    ``prepare`` callback of :func:`create_many` may set both."""

    principal: Principal
    spec: JobSpec
    idempotency_key: str | None = None
    lineage: str | None = None
    hold: Callable[[list[Any]], str | None] | None = None


def create_many(session: Session, submissions: list[Submission], *, default_time_limit_s: int,
                max_time_limit_s: int, caps: SubmitCaps | None = None,
                waiting_reason: str = "waiting for dispatch",
                prepare: Callable[[Session, Submission], None] | None = None) -> list[tuple[Job, bool] | GatewayError]:
    """Record ``submissions`` in the caller's transaction, judged one after another in order
    as if each were alone (issue #32, group commit): one result each, ``(job, created)`` or
    the refusal (403, 409, 422, 429) that the request gets. A refused submission writes
    nothing and does not stop the others.

    Statements per call, whatever the number of submissions: ``prepare`` (admission's
    early refusals: reads only in uncommon cases), the cap locks of every account and user
    at once (Postgres), one cap read per distinct account, user and key use (two when an
    admin cap is set on the chain), and ONE insert of every plain job and its event
    (Postgres; two executemany on SQLite). The caps stay exact: every count is read under the
    locks before anything is written, and each submission is judged by :func:`admit` on
    those counts plus the batch's earlier admissions (``CapTally``). Submissions with an
    Idempotency-Key or dependencies take the ORM path (savepoint, key row, dependency rows)
    at their turn, so a later duplicate key in the same call replays the first.

    Raises:
        Only what is not a refusal of one submission before anything of it was written (a
        database error, an insert that lost its account meanwhile, ``RefusedWhileWriting``):
        the caller rolls back and may retry each submission alone, where a lost account is
        its 422.
    """
    results: list[Any] = [None] * len(submissions)
    live: list[int] = []
    for i, sub in enumerate(submissions):
        try:
            if prepare is not None:
                prepare(session, sub)
            check_caller(sub.principal, sub.spec.account)
            live.append(i)
        except GatewayError as exc:
            results[i] = exc
    reads: dict[tuple, CapRead | None] = {}
    if caps is not None and live:
        groups = sorted({(s.spec.account, s.principal.username, s.principal.subject, s.idempotency_key is not None)
                         for s in (submissions[i] for i in live)})
        lock_caps(session, [(account, username) for account, username, _, _ in groups])
        now = utcnow()  # every count is read before anything is written
        for account, username, subject, with_key in groups:
            reads[(account, username, subject, with_key)] = read_caps(
                session, account=account, username=username, subject=subject, caps=caps, with_key=with_key, now=now)
    tally = CapTally()
    plain: list[tuple[int, dict[str, Any]]] = []
    for i in live:
        sub = submissions[i]
        try:
            results[i] = _admit_one(session, i, sub, reads, tally, plain, caps=caps, waiting_reason=waiting_reason,
                                    default_time_limit_s=default_time_limit_s, max_time_limit_s=max_time_limit_s)
        except GatewayError as exc:
            results[i] = exc
    if plain:
        _insert_new(session, [values for _, values in plain])
        for i, values in plain:
            results[i] = Job(**{k: v for k, v in values.items() if k != "actor"}), True
    return results


def _admit_one(session: Session, index: int, sub: Submission, reads: dict, tally: CapTally, plain: list, *,
               caps: SubmitCaps | None, waiting_reason: str, default_time_limit_s: int,
               max_time_limit_s: int) -> tuple[Job, bool] | None:
    """One submission's turn in :func:`create_many`: a refusal raises before anything of it is
    written (a GatewayError); a plain job is queued in ``plain`` (None), a keyed or dependent
    one written now. An error while writing is not a refusal: it propagates as such."""
    principal, spec, key = sub.principal, sub.spec, sub.idempotency_key
    digest = spec_hash(spec) if key is not None else ""  # only a keyed request is compared
    if key is not None:
        existing = repository.get_idempotency(session, principal.subject, key)
        if existing is not None:
            return _replay(session, existing, digest), False
    time_limit_s = time_limit_of(spec.time_limit, default_s=default_time_limit_s, max_s=max_time_limit_s)
    before = CapTally(tally)
    if caps is not None:
        read = reads[(spec.account, principal.username, principal.subject, key is not None)]
        if read is None:
            raise Invalid("body.account", f"unknown account {spec.account!r}")
        # Judged before the hold, as one request was: a refused job never reaches it. The
        # tally is taken back if the hold or the dependencies refuse the job after all.
        admit(read, tally)
        try:
            held = sub.hold(read.chain[::-1]) if sub.hold is not None else None
            if held:
                waiting_reason = f"held: {held}"
            resolved = _resolve(session, sub)
        except BaseException:
            tally.clear()
            tally.update(before)
            raise
    else:
        resolved = _resolve(session, sub)
    now = utcnow()
    values = dict(
        id=new_id(), name=spec.name, account_name=spec.account, submitted_by=principal.subject,
        username=principal.username, requested_pool=spec.pool, pool=None,
        state=JobState.PENDING.value, state_reason=waiting_reason, spec=spec.stored(),
        workers=spec.workers, gpus_per_worker=spec.gpus_per_worker, total_gpus=spec.total_gpus,
        time_limit_s=time_limit_s, priority=spec.priority, routing_reason="", dispatch_attempts=0,
        created_at=now, updated_at=now, lineage=sub.lineage if spec.checkpoint else None,
    )
    if resolved is not None and not resolved.met:
        values.update(state=JobState.BLOCKED.value, state_reason=resolved.reason)
    if key is None and resolved is None:
        # The hot path (bench/bench_api.py): written with the batch's other plain jobs in
        # one Core insert. The account's existence was checked by the cap read; without
        # caps, by the foreign key (an unknown account fails the insert, nothing is written).
        plain.append((index, {**values, "actor": principal.subject}))
        return None
    try:
        job, created = _write_orm(session, values, principal, key, digest, resolved)
    except GatewayError as exc:
        # Refused after some of it may have been written: not this member's refusal alone,
        # the transaction must go (the caller re-runs the batch one by one).
        raise RefusedWhileWriting(exc) from exc
    if not created:  # a concurrent request with the same key won: this one adds nothing
        tally.clear()
        tally.update(before)
    return job, created


def _resolve(session: Session, sub: Submission):
    if not sub.spec.depends_on:
        return None
    from gateway.jobs import graph as flows

    return flows.resolve(session, principal=sub.principal, depends_on=sub.spec.depends_on)


def _write_orm(session: Session, values: dict[str, Any], principal: Principal, key: str | None, digest: str,
               resolved) -> tuple[Job, bool]:
    """A keyed or dependent job: the ORM path (savepoint for the key, dependency rows)."""
    if session.get(Account, values["account_name"]) is None:
        raise Invalid("body.account", f"unknown account {values['account_name']!r}")
    job = Job(**values)
    if key is None:
        session.add(job)
        session.flush()
    elif not _insert_with_key(session, job, principal, key, digest):
        # A concurrent request with the same key won the race; answer as it did.
        existing = repository.get_idempotency(session, principal.subject, key)
        return _replay(session, existing, digest), False
    record_event(session, job, actor=principal.subject, kind="state", to_state=job.state,
                 reason="submitted", data={"idempotency_key": key} if key else None)
    if resolved is not None:
        from gateway.jobs import graph as flows

        flows.add_dependencies(session, [job.id], resolved)
    return job, True


_NEW_JOB_COLS = ("id", "name", "account_name", "submitted_by", "username", "requested_pool", "pool", "state",
                 "state_reason", "spec", "workers", "gpus_per_worker", "total_gpus", "time_limit_s", "priority",
                 "routing_reason", "dispatch_attempts", "created_at", "updated_at", "lineage")
@functools.lru_cache(maxsize=4)
def _insert_new_sql(dialect) -> Any:
    """Postgres: new jobs and their first events in ONE statement over one JSON document
    (``:rows``, gateway/kit/bulk.py), whatever their number; the events follow the rows' order."""
    from sqlalchemy import text

    record = ", ".join(f"{c} {_JOB_T.c[c].type.compile(dialect=dialect)}" for c in _NEW_JOB_COLS)
    cols = ", ".join(_NEW_JOB_COLS)
    return text(f"""WITH r AS (SELECT * FROM json_to_recordset(CAST(:rows AS json))
                               AS r({record}, actor {_EVENT_T.c.actor.type.compile(dialect=dialect)}, ord integer)),
new_job AS (INSERT INTO job ({cols}) SELECT {cols} FROM r ORDER BY r.ord RETURNING id)
INSERT INTO job_event (job_id, at, actor, kind, from_state, to_state, reason, data)
SELECT r.id, r.created_at, r.actor, 'state', NULL, r.state, 'submitted', NULL
FROM r JOIN new_job ON new_job.id = r.id ORDER BY r.ord""")


def _insert_new(session: Session, rows: list[dict[str, Any]]) -> None:
    """Write new plain jobs (``_NEW_JOB_COLS`` and the submitter as ``actor``) with their
    ``submitted`` events: one statement on Postgres, two executemany on SQLite.

    An unknown account fails the foreign key and nothing is written: for one job that is the
    422 naming ``body.account``; for several the error propagates (the caller retries each
    alone)."""
    conn = session.connection()
    try:
        if conn.dialect.name == "postgresql":
            conn.execute(_insert_new_sql(conn.dialect), {"rows": bulk.document(
                [{**{c: row[c] for c in _NEW_JOB_COLS}, "actor": row["actor"], "ord": i} for i, row in enumerate(rows)])})
        else:
            conn.execute(_JOB_T.insert(), [{c: row[c] for c in _NEW_JOB_COLS} for row in rows])
            conn.execute(_EVENT_T.insert(), [
                {"job_id": row["id"], "at": row["created_at"], "actor": row["actor"], "kind": "state",
                 "from_state": None, "to_state": row["state"], "reason": "submitted", "data": None} for row in rows])
    except IntegrityError as exc:
        if len(rows) == 1 and _is_foreign_key_violation(exc):
            raise Invalid("body.account", f"unknown account {rows[0]['account_name']!r}") from None
        raise


def _is_foreign_key_violation(exc: IntegrityError) -> bool:
    orig = exc.orig
    return getattr(orig, "sqlstate", None) == "23503" or "FOREIGN KEY constraint failed" in str(orig)


def _insert_with_key(session: Session, job: Job, principal: Principal, key: str, digest: str) -> bool:
    """Insert the job and its key; False when a concurrent request took the key first.

    The savepoint (two extra round trips) is only paid when a unique key can collide.
    """
    try:
        with session.begin_nested():
            session.add(job)
            session.flush()
            session.add(IdempotencyKey(subject=principal.subject, key=key, request_hash=digest, job_id=job.id,
                                       created_at=utcnow()))
            session.flush()
    except IntegrityError:
        if repository.get_idempotency(session, principal.subject, key) is None:
            raise
        return False
    return True


def _replay(session: Session, existing: IdempotencyKey, digest: str) -> Job:
    if existing.request_hash != digest:
        raise Conflict("this Idempotency-Key was already used with a different request body")
    job = session.get(Job, existing.job_id)
    assert job is not None
    return job


def get_or_raise(session: Session, *, principal: Principal, job_id: str, for_update: bool = False) -> Job:
    job = repository.get_readable(session, principal, job_id, for_update=for_update)
    if job is None:
        raise NotFound(f"no job {job_id!r} visible to you")
    return job


def cancel(session: Session, *, principal: Principal, job_id: str, reason: str = "", cascade: bool = False) -> Job:
    """Cancel a job; with ``cascade``, also every job that waits for it (transitively)."""
    job = get_or_raise(session, principal=principal, job_id=job_id, for_update=True)
    if job.job_state.final:
        raise Conflict(f"job already {job.state}")
    why = reason or f"cancelled by {principal.username or principal.subject}"
    if cascade:
        from gateway.jobs.graph import dependents_for_cascade

        # Newest first: a dependency always names an older job, so by descending id every
        # dependent is cancelled before what it waits for, and none is released meanwhile.
        for dependent in sorted(dependents_for_cascade(session, job, principal=principal), key=lambda j: j.id, reverse=True):
            cancel_job(session, job=dependent, actor=principal.subject, reason=f"{why} (cascade from job {job.id})")
    cancel_job(session, job=job, actor=principal.subject, reason=why)
    return job


def cancel_job(session: Session, *, job: Job, actor: str, reason: str) -> None:
    """Cancel one loaded (and locked) job: at once if never sent anywhere, else via ``cancelling``."""
    state = job.job_state
    if state.final or state is JobState.CANCELLING:
        return
    if job.cancel_requested_at is None:
        job.cancel_requested_at = utcnow()
    if state in (JobState.PENDING, JobState.BLOCKED):
        # Never sent anywhere: it ends now, and it has no exit code.
        job.ended_at = job.cancel_requested_at
        set_state(session, job, JobState.CANCELLED, actor=actor, reason=reason)
    else:
        # Submitted (or being submitted): the control loop cancels it on the backend and
        # moves it to cancelled when the backend confirms.
        set_state(session, job, JobState.CANCELLING, actor=actor, reason=reason)
