"""What a backend's status means for a registry job: pure functions, no database, no cluster."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Literal

from adapters.base import BackendState, JobStatus
from gateway.domain.states import JobState, can_transition
from gateway.kit.timeutil import as_utc

BACKEND_TO_JOB = {
    BackendState.QUEUED: JobState.QUEUED,
    BackendState.STARTING: JobState.STARTING,
    BackendState.RUNNING: JobState.RUNNING,
    BackendState.REQUEUED: JobState.REQUEUED,
    BackendState.SUCCEEDED: JobState.SUCCEEDED,
    BackendState.FAILED: JobState.FAILED,
    BackendState.CANCELLED: JobState.CANCELLED,
}


def requeued_at(*, state: JobState, started_at: datetime | None, status: JobStatus, now: datetime) -> datetime | None:
    """When the backend took this job's running gang down and queued it again, or None.

    A ``running`` job reported queued or requeued was requeued (Slurm shows a requeued job
    as plain PENDING). A ``running`` job whose backend reports a requeue newer than the run
    the registry recorded was requeued in between two looks, even if it runs again (or has
    ended) by now. The time is the backend's where it reports one (``status.requeued_at``),
    else ``now`` (the gang was still held when last seen); never before the run's start
    nor after ``now``.
    """
    if state is not JobState.RUNNING or started_at is None:
        return None
    backend_at = as_utc(status.requeued_at)
    if status.state in (BackendState.QUEUED, BackendState.REQUEUED):
        # An older requeue than the run the registry recorded says nothing about this one.
        at = backend_at if backend_at is not None and backend_at >= started_at else now
    elif backend_at is not None and backend_at > started_at:
        at = backend_at
    else:
        return None
    return min(max(at, started_at), now)




@dataclasses.dataclass(frozen=True)
class Meaning:
    """What one backend status says about one registry job (see :func:`meaning`)."""

    target: JobState  # the registry state the backend's state maps to
    reason: str  # the backend's words, kept on the job
    foreign: bool = False  # not the submission the registry recorded: it says nothing about this job
    awaiting_cancel: bool = False  # the job is cancelling and the backend has not ended it yet
    requeued_at: datetime | None = None  # the running gang was taken down then (a requeue to record)
    requeue_reason: str = ""
    after_requeue: bool = False  # ... and the status already reports the next run (running again or ended)


def meaning(*, state: JobState, started_at: datetime | None, backend_job_id: str | None, status: JobStatus,
            now: datetime, cancel_requested_at: datetime | None = None) -> Meaning:
    """What ``status`` (from the backend) means for a job the registry has in ``state``.

    ``started_at`` is the start of the run the registry recorded and ``backend_job_id`` the
    backend job it recorded (None before the submission is recorded); ``cancel_requested_at``
    when a cancel was accepted.
    """
    target = BACKEND_TO_JOB[status.state]
    reason = status.reason or status.raw_state or target.value
    if backend_job_id and status.backend_job_id != backend_job_id:
        return Meaning(target, reason, foreign=True)
    if state is JobState.CANCELLING and not target.final:
        return Meaning(target, reason, awaiting_cancel=True)
    if state is JobState.CANCELLING and target is not JobState.CANCELLED:
        return _cancelled_first(target, reason, status, cancel_requested_at)
    at = requeued_at(state=state, started_at=started_at, status=status, now=now)
    if at is None:
        return Meaning(target, reason)
    again = target not in (JobState.QUEUED, JobState.REQUEUED)
    seen = f"requeued at {at.isoformat()} and {target.value} again before the gateway looked" if again else reason
    return Meaning(target, reason, requeued_at=at, requeue_reason=seen, after_requeue=again)


def _cancelled_first(target: JobState, reason: str, status: JobStatus,
                     cancel_requested_at: datetime | None) -> Meaning:
    """A cancelling job the backend reports ended on its own (succeeded, or failed).

    A cancel the gateway accepted could not reach the backend at once (its pool cut off, the
    claim's worker dead): the job may have run on and ended meanwhile. Ended after the cancel
    was accepted (or at a time the backend does not say): it is ``cancelled``, as its owner
    asked, with the backend's ending in the reason (issue #47, item 6). Ended before: the
    cancel came too late, and the job's own ending stands.
    """
    ended = as_utc(status.ended_at)
    asked = as_utc(cancel_requested_at)
    if ended is not None and asked is not None and ended < asked:
        return Meaning(target, reason)
    exit_words = f", exit code {status.exit_code}" if status.exit_code is not None else ""
    return Meaning(JobState.CANCELLED, f"cancelled; the backend ended it first ({target.value}{exit_words}: "
                                       f"{reason}) before the cancel could reach it")


Step = Literal["finish", "note", "move"]


def step(state: JobState, target: JobState) -> Step:
    """How a job in ``state`` follows a backend reporting ``target``.

    ``finish``: the job ended; ``move``: a legal transition to ``target``; ``note``: the
    state stays (same state, or a move the state machine forbids, e.g. running -> starting
    when one worker finishes before its peers: the gang has run) and only the backend's
    words are kept.
    """
    if target.final:
        return "finish"
    if state is target or not can_transition(state, target):
        return "note"
    return "move"


Absence = Literal["cancelled", "wait", "count_miss"]


def absence(state: JobState) -> Absence:
    """What it means that the backend has no job for a registry job in ``state``.

    A cancelling job is cancelled; a job being dispatched may not have reached the backend
    yet; any other is counted as a miss, and lost only after several (one miss is not a
    loss: a backend restarting, a stale listing).
    """
    if state is JobState.CANCELLING:
        return "cancelled"
    if state is JobState.DISPATCHING:
        return "wait"
    return "count_miss"


HELD_STATES = frozenset({JobState.DISPATCHING, JobState.QUEUED, JobState.REQUEUED, JobState.STARTING})


@dataclasses.dataclass(frozen=True)
class Seen:
    """One event of a job's history, as :func:`held_since` reads it."""

    at: datetime
    state_change: bool  # a state event (the job moved): a new wait begins
    held: str = ""  # the backend's hold code recorded with it ("" when not held)


def held_since(history: list[Seen]) -> datetime | None:
    """When the job's current wait began to be held (see ``JobStatus.held``), or None.

    ``history`` is the job's events, oldest first. The current wait begins at the last state
    event; the hold began at the first event since then that recorded one. A Slurm job
    whose launch keeps failing alternates between BeginTime and other reasons while it
    waits: that does not restart the clock; a job that moves (runs, is requeued) does.
    """
    last_move = max((i for i, ev in enumerate(history) if ev.state_change), default=0)
    return next((as_utc(ev.at) for ev in history[last_move:] if ev.held), None)


Hold = Literal["none", "wait", "fail"]


def hold_verdict(*, state: JobState, held: str, since: datetime | None, now: datetime, bound_s: float) -> Hold:
    """What to do about a job its backend holds (``held``: the backend's hold code).

    ``none``: not held (or not waiting, or cancelling: the cancel is on its way), nothing
    to do; ``wait``: held for less than ``bound_s`` so far (or ``bound_s`` is 0: wait
    forever); ``fail``: held for ``bound_s`` or longer, so cancel it on the backend and fail it.
    A hold with no recorded start (``since`` None) begins now, so it waits.
    """
    if not held or state not in HELD_STATES:
        return "none"
    if not bound_s or since is None:
        return "wait"
    return "fail" if (now - since).total_seconds() >= bound_s else "wait"


def hold_failure_reason(reason: str, *, pool: str, held_s: float, bound_s: float) -> str:
    """The failed job's reason: the backend's words (already the user's) and what the gateway did."""
    return (f"{reason}. The gateway gave up after the job was held {int(held_s)} s "
            f"(ISTHMUS_HELD_JOB_FAIL_AFTER_S={bound_s:g}) and cancelled it on {pool}")
