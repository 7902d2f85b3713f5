"""The job state machine and its named transitions; reading and cancelling a job.

``set_state`` is the only way a job's state changes; it writes the event in the same
transaction (gateway/jobs/journal.py), so the history is complete. The dispatcher changes a
job only through the named transitions below; a dispatch round's many claims go through
gateway/jobs/claims.py. New jobs are recorded by gateway/jobs/intake.py and written by
gateway/jobs/store.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import String, bindparam, select
from sqlalchemy.orm import Session

from gateway.domain import nodehealth
from gateway.domain.states import JobState, check_transition
from gateway.identity.principal import Principal
from gateway.jobs import journal, node_record, repository
from gateway.kit.errors import Conflict, NotFound
from gateway.kit.timeutil import utcnow
from gateway.models.jobs import Job, JobAttempt, JobEvent

log = logging.getLogger("isthmus.jobs")


def record_event(session: Session, job: Job, *, actor: str, kind: str, reason: str = "",
                 data: dict[str, Any] | None = None, from_state: str | None = None,
                 to_state: str | None = None) -> JobEvent:
    """An event of a loaded job (gateway/jobs/journal.py writes it)."""
    return journal.record(session, job.id, actor=actor, kind=kind, reason=reason, data=data,
                          from_state=from_state, to_state=to_state)


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
_EVENT_T = journal.TABLE
_SUBMITTED_UPDATE = (
    _JOB_T.update()
    .where(_JOB_T.c.id == bindparam("job_id"), _JOB_T.c.state == JobState.DISPATCHING.value,
           _JOB_T.c.backend_job_id.is_(None))
    .values(state=JobState.QUEUED.value, state_reason=bindparam("reason"), backend_job_id=bindparam("backend_job_id"),
            next_attempt_at=None, updated_at=bindparam("now"))
)
_SUBMITTED = dict(from_state=JobState.DISPATCHING, to_state=JobState.QUEUED, reason=bindparam("reason", type_=String()),
                  data=bindparam("data", type_=_EVENT_T.c.data.type))
_SUBMITTED_CTE = _SUBMITTED_UPDATE.returning(_JOB_T.c.id).cte("submitted_job")
_MARK_SUBMITTED_PG = journal.after(_SUBMITTED_CTE, _SUBMITTED_CTE.c.id, bindparam("now"), **_SUBMITTED).returning(
    _EVENT_T.c.job_id)
_SUBMITTED_EVENT = journal.values_insert(bindparam("job_id"), bindparam("now"), **_SUBMITTED)
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


def renew_lease(session: Session, job: Job, *, until: datetime, actor: str, reason: str,
                owner: int | None = None) -> None:
    """A dispatcher re-drives a claim whose lease ended or whose worker died: it holds the
    claim until ``until``, as ``owner`` (its liveness key; dispatch/liveness.py)."""
    job.next_attempt_at = until
    job.claim_owner = owner
    record_event(session, job, actor=actor, kind="recovery", reason=reason)


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
                exit_code: int | None, backend_reason: str, charged_gpu_seconds: int,
                failed_nodes: Sequence[str] = ()) -> JobAttempt:
    """Record the job's current attempt as ended (a ``job_attempt`` row: pool, backend job,
    nodes, times, why, what its run was charged; and its node-health record) and move the job
    to its next attempt number."""
    node_record.record(session, job, number=job.attempt, outcome=outcome, ended_at=ended_at, nodes=job.nodes,
                       failed_nodes=failed_nodes, charged_gpu_seconds=charged_gpu_seconds, reason=backend_reason)
    attempt = JobAttempt(job_id=job.id, number=job.attempt, pool=job.pool, backend_job_id=job.backend_job_id,
                         nodes=list(job.nodes) if job.nodes else None, started_at=started_at, ended_at=ended_at,
                         outcome=outcome, exit_code=exit_code, reason=backend_reason,
                         charged_gpu_seconds=int(charged_gpu_seconds))
    session.add(attempt)
    job.attempt += 1
    return attempt


def retry(session: Session, job: Job, *, outcome: str, started_at: datetime | None, ended_at: datetime,
          exit_code: int | None, backend_reason: str, charged_gpu_seconds: int, actor: str, reason: str,
          data: dict[str, Any] | None = None, failed_nodes: Sequence[str] = ()) -> JobAttempt:
    """End the job's current attempt and queue the next one in the gateway (docs/recovery.md).

    The ended attempt becomes a ``job_attempt`` row (:func:`end_attempt`); the job goes back
    to ``pending`` with its next attempt number and nothing of the old run (pool, backend
    job, nodes, start): routing and admission decide afresh, and the job keeps its id, so
    its place in line (priority, then age) and its checkpoint lineage.
    """
    attempt = end_attempt(session, job, outcome=outcome, started_at=started_at, ended_at=ended_at,
                          exit_code=exit_code, backend_reason=backend_reason, charged_gpu_seconds=charged_gpu_seconds,
                          failed_nodes=failed_nodes)
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
           exit_code: int | None = None, data: dict[str, Any] | None = None, outcome: str | None = None,
           failed_nodes: Sequence[str] = (), charged_gpu_seconds: int = 0) -> None:
    """Move to the final state ``target`` at ``ended_at``, with the exit code the job reports.

    The last attempt, when it ran on nodes, goes on the node-health record as ``outcome``
    (default: what ``target`` and the exit code say, nodehealth.outcome_of)."""
    if not target.final:
        raise ValueError(f"{target.value} is not a final state")
    node_record.record(session, job, number=job.attempt, ended_at=ended_at, nodes=job.nodes,
                       outcome=outcome or nodehealth.outcome_of(target.value, exit_code=exit_code),
                       failed_nodes=failed_nodes, charged_gpu_seconds=charged_gpu_seconds, reason=reason)
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
