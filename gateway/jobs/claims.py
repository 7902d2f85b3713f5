"""The dispatch round's writer: claims, waiting notes and estimates of many jobs at once.

:class:`Claims` is the one writer of these changes (a single job's :func:`claim`,
:func:`note_waiting` and :func:`note_estimate` are batches of one): each call shows its values
on the loaded job at once, and :meth:`Claims.flush` writes them all, with their events
(gateway/jobs/journal.py), in one statement on Postgres. Split out of gateway/jobs/service.py
(issue #46): the state machine's rules (``states.check_transition``) are checked here in
bulk, as ``service.set_state`` checks them one by one.
"""

from __future__ import annotations

import functools
import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.orm import Session, object_session
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from gateway.domain.states import JobState, check_transition
from gateway.domain.waiting import same_meaning
from gateway.jobs import journal
from gateway.kit import bulk
from gateway.kit.errors import Conflict
from gateway.kit.timeutil import utcnow
from gateway.models.jobs import Job

log = logging.getLogger("isthmus.jobs")

_JOB_T = Job.__table__
_EVENT_T = journal.TABLE


def claim(session: Session, job: Job, *, pool: str, held_gpus: int, reason: str, lease_until: datetime,
          actor: str, data: dict[str, Any] | None = None, borrowed: bool | None = None,
          backend_reservation: str | None = None, owner: int | None = None) -> None:
    """``pending`` -> ``dispatching`` on ``pool``, holding ``held_gpus``, leased until ``lease_until``.

    A batch of one of :class:`Claims` (the dispatch round's writer): one implementation.
    """
    writes = Claims(session)
    writes.claim(job, pool=pool, held_gpus=held_gpus, reason=reason, lease_until=lease_until, actor=actor, data=data,
                 borrowed=borrowed, backend_reservation=backend_reservation, owner=owner)
    writes.flush()


_CLAIM_COLS = ("pool", "held_gpus", "borrowed", "backend_reservation", "routing_reason", "next_attempt_at", "claim_owner",
               "dispatch_attempts",
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
                 ("next_attempt_at", _JOB_T, "next_attempt_at"), ("claim_owner", _JOB_T, "claim_owner"),
                 ("dispatch_attempts", _JOB_T, "dispatch_attempts"),
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
        next_attempt_at = r.next_attempt_at, claim_owner = r.claim_owner, dispatch_attempts = r.dispatch_attempts,
        estimated_start = NULL,
        estimated_pool = NULL, estimate_reason = NULL, state = '{to}', state_reason = r.reason, updated_at = r.at
    FROM r WHERE job.id = r.id AND job.state = r.from_state
    RETURNING job.id),
{journal.claim_events_cte(to)}"""


_NOTE_COLS = ("state_reason", "estimated_start", "estimated_pool", "estimate_reason", "updated_at")
_NOTE_UPDATE = (_JOB_T.update().where(_JOB_T.c.id == bindparam("n_id"), _JOB_T.c.state == bindparam("n_from_state"))
                .values({c: bindparam(f"n_{c}", type_=_JOB_T.c[c].type) for c in _NOTE_COLS}))


def _notes_ctes(dialect) -> str:
    """``noted`` (the noted pending jobs' ids) and their ``waiting`` events (in the order noted),
    over the documents ``:notes`` and ``:events``."""
    typed = bulk.record_columns(_JOB_T, ("id", *_NOTE_COLS), dialect)
    # The guard compares with the record's from_state, not a constant: with state = 'pending'
    # (100,000 rows) a planner whose statistics lag chose to scan them all and hash-join.
    return f"""
noted AS (
    UPDATE job SET {", ".join(f"{c} = n.{c}" for c in _NOTE_COLS)}
    FROM json_to_recordset(CAST(:notes AS json)) AS n({typed}, from_state VARCHAR(16))
    WHERE job.id = n.id AND job.state = n.from_state
    RETURNING job.id),
{journal.waiting_events_cte(dialect)}"""


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
        """Keep 'why is my job not running' on the job, with a ``waiting`` event, when it changes in
        meaning (``domain/waiting.py::same_meaning``); else write nothing.

        Counters, times, an unavailable pool's error words and the order of pools are not a new
        reason: two dispatch workers each see their own (issue #47, 6), and a round per second
        over them wrote a reason and an event per job per second while nothing changed.
        """
        if same_meaning(job.state_reason, reason):
            return
        self._ready(job)
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
              backend_reservation: str | None = None, owner: int | None = None) -> None:
        """``pending`` -> ``dispatching`` on ``pool``, holding ``held_gpus``, leased until ``lease_until``;
        ``borrowed``: whether the attempt runs beyond every guarantee (None: none is set anywhere);
        ``backend_reservation``: the backend's own reservation it runs in (None: open capacity);
        ``owner``: the claiming worker's liveness key (None: unknown; dispatch/liveness.py)."""
        self._ready(job)
        current = job.state
        now = self._at = self._at or utcnow()
        values = dict(pool=pool, held_gpus=held_gpus, borrowed=borrowed, backend_reservation=backend_reservation,
                      routing_reason=reason,
                      next_attempt_at=lease_until, claim_owner=owner,
                      dispatch_attempts=job.dispatch_attempts + 1, estimated_start=None, estimated_pool=None,
                      estimate_reason=None, state=JobState.DISPATCHING.value, state_reason=reason, updated_at=now)
        self._claims.append(dict(id=job.id, from_state=current, pool=pool, held_gpus=held_gpus, borrowed=borrowed,
                                 backend_reservation=backend_reservation, reason=reason,
                                 next_attempt_at=lease_until, claim_owner=owner,
                                 dispatch_attempts=values["dispatch_attempts"], at=now,
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
        journal.insert_many(conn, [{k: v for k, v in e.items() if k != "ord"} for e in events])
        return done

    @staticmethod
    def _claims_sqlite(conn, claims: list[dict[str, Any]]) -> int:
        if not claims:
            return 0
        done = conn.execute(_CLAIM_UPDATE, [
            {"c_id": c["id"], "c_from": c["from_state"], "c_pool": c["pool"], "c_held_gpus": c["held_gpus"],
             "c_borrowed": c["borrowed"], "c_backend_reservation": c["backend_reservation"],
             "c_routing_reason": c["reason"], "c_next_attempt_at": c["next_attempt_at"],
             "c_claim_owner": c["claim_owner"],
             "c_dispatch_attempts": c["dispatch_attempts"], "c_estimated_start": None, "c_estimated_pool": None,
             "c_estimate_reason": None, "c_state": JobState.DISPATCHING.value, "c_state_reason": c["reason"],
             "c_updated_at": c["at"]} for c in claims]).rowcount
        journal.insert_many(conn, [
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


def note_waiting(session: Session, job: Job, *, reason: str, actor: str) -> None:
    """:meth:`Claims.note_waiting` of one job (a batch of one)."""
    writes = Claims(session)
    writes.note_waiting(job, reason=reason, actor=actor)
    writes.flush()
