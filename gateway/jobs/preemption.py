"""The record of reclaim (docs/recovery.md, "Reclaim"): the one writer of ``job_preemption``.

A dispatch round that decides to stop borrowed gangs (gateway/domain/decide.py ``_reclaim``)
records each victim here, in its own transaction (:func:`choose`); the dispatcher's
preemptor (gateway/dispatch/preempt.py) then signals it (:func:`signalled`) and, at the
deadline, stops it (:func:`stopped`); the reconciler, seeing the attempt end, closes the
record (:func:`close`) and runs the job again under its retry policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, insert, literal, select, update
from sqlalchemy.orm import Session

from gateway.domain.preempt import at_risk_gpu_hours
from gateway.domain.states import JobState
from gateway.jobs import journal
from gateway.models.jobs import Job, JobPreemption

KIND = "preemption"  # the kind of the events it writes


def _hours(h: float) -> str:
    return f"{h:.2f}"


def choose(session: Session, reclaims: Sequence[Any], *, now: datetime, grace_s: float, actor: str) -> list[str]:
    """Record the victims of a round's reclaims (``decide.Reclaim``: a preemptor and its eviction).

    A victim is recorded only while it still runs the attempt the round saw (it may have
    ended meanwhile: then nothing is written for it). Returns the recorded victims' ids.
    """
    deadline = now + timedelta(seconds=grace_s)
    recorded: list[str] = []
    for reclaim in reclaims:
        preemptor, ev = reclaim.job, reclaim.eviction
        for victim in ev.victims:
            risk = at_risk_gpu_hours(victim, now.timestamp())
            since = ("its last checkpoint" if victim.checkpoint_at and victim.checkpoint_at > victim.started_at
                     else "it started")
            why = (f"preempted: chosen to stop so that {preemptor.account_name}'s job {preemptor.id} "
                   f"({preemptor.total_gpus} GPUs), within its guarantee, can start on {ev.pool}. This job runs on "
                   f"borrowed GPUs; {_hours(risk)} GPU-hours since {since} are at risk. It is signalled now and "
                   f"stopped at {deadline.isoformat(timespec='seconds')}, then runs again under its retry policy")
            row = select(Job.id, Job.attempt, literal(ev.pool), literal(preemptor.id),
                         literal(preemptor.account_name), literal(victim.gpus), literal(risk), literal(why),
                         literal(now), literal(deadline)).where(
                Job.id == victim.id, Job.state == JobState.RUNNING.value,
                ~exists().where(and_(JobPreemption.job_id == Job.id, JobPreemption.attempt == Job.attempt)))
            done = session.execute(insert(JobPreemption).from_select(
                ["job_id", "attempt", "pool", "preemptor_id", "preemptor_account", "gpus", "gpu_hours_at_risk",
                 "reason", "chosen_at", "deadline"], row))
            if not done.rowcount:
                continue
            recorded.append(victim.id)
            journal.record(session, victim.id, at=now, actor=actor, kind=KIND, reason=why, data={
                "preemptor": preemptor.id, "preemptor_account": preemptor.account_name, "pool": ev.pool,
                "deadline": deadline.isoformat(), "gpu_hours_at_risk": round(risk, 4)})
        journal.record(session, preemptor.id, at=now, actor=actor, kind=KIND,
                       reason=f"reclaiming borrowed GPUs {ev.reason}",
                       data={"victims": [v.id for v in ev.victims], "pool": ev.pool,
                             "deadline": deadline.isoformat()})
    session.flush()
    return recorded


def open_preemptions(session: Session) -> list[tuple[JobPreemption, Job]]:
    """Preemptions not yet closed, with their jobs (the preemptor's work list)."""
    return list(session.execute(select(JobPreemption, Job).join(Job, Job.id == JobPreemption.job_id)
                                .where(JobPreemption.ended_at.is_(None))).tuples())


def current(session: Session, job: Job) -> JobPreemption | None:
    """The preemption of the job's current attempt, if the gateway chose to stop it and has not called it off."""
    p = session.get(JobPreemption, (job.id, job.attempt))
    return p if p is not None and p.ended_at is None else None


def _mark(session: Session, job_id: str, attempt: int, **values: Any) -> None:
    session.execute(update(JobPreemption).where(JobPreemption.job_id == job_id, JobPreemption.attempt == attempt)
                    .values(**values))


def signalled(session: Session, job_id: str, attempt: int, *, at: datetime, actor: str, words: str) -> None:
    """The backend was asked to signal the victim (what it sends is in ``words``)."""
    _mark(session, job_id, attempt, signalled_at=at)
    journal.record(session, job_id, at=at, actor=actor, kind=KIND, reason=words)


def stopped(session: Session, job_id: str, attempt: int, *, at: datetime, actor: str, words: str) -> None:
    """The backend was asked to stop the victim (the grace period is over)."""
    _mark(session, job_id, attempt, stopped_at=at)
    journal.record(session, job_id, at=at, actor=actor, kind=KIND, reason=words)


# The states in which a preemptor still waits for the room its reclaim makes.
WAITING = frozenset({JobState.PENDING, JobState.DISPATCHING, JobState.QUEUED, JobState.REQUEUED})


def reason_gone(session: Session, p: JobPreemption) -> str | None:
    """Why the reclaim ``p`` no longer has a reason, or None while it still has one.

    A reclaim stops a borrowed job so that a job within its guarantee can start. If that job
    stopped waiting (cancelled, failed, held back, started elsewhere, deleted) before the
    victim is stopped, stopping the victim would cost its owner an attempt for nothing (issue
    #45, finding 3): the preemptor calls it off (:func:`call_off`)."""
    if p.preemptor_id is None:
        return f"{p.preemptor_account}'s job it made room for no longer exists"
    state = session.scalar(select(Job.state).where(Job.id == p.preemptor_id))
    if state is None:
        return f"{p.preemptor_account}'s job {p.preemptor_id} no longer exists"
    if JobState(state) in WAITING:
        return None
    return f"{p.preemptor_account}'s job {p.preemptor_id} is {state}: it no longer waits for this room"


def call_off(session: Session, job_id: str, attempt: int, *, at: datetime, actor: str, why: str) -> None:
    """The reclaim of the victim's attempt is over before it was stopped: the victim keeps running."""
    _mark(session, job_id, attempt, ended_at=at)
    journal.record(session, job_id, at=at, actor=actor, kind=KIND,
                   reason=f"reclaim called off: {why}. This job keeps running", data={"called_off": True})


def close(session: Session, job_id: str, attempt: int, *, at: datetime) -> None:
    """The victim's attempt ended (or it was not running any more): the preemption is over."""
    _mark(session, job_id, attempt, ended_at=at)
