"""The job state machine, enforced in one place.

    blocked -> pending -> dispatching -> queued -> starting -> running -> succeeded | failed | cancelled
                     ^            |          |          |
                     |            +----------+----------+--> requeued -> queued/starting/running
    (submission failed, retried)                        +--> cancelling -> cancelled

``blocked`` (gateway/flows): a job waiting for its dependencies or for a free slot of its
array (``max_running``). Not in the dispatch pick and reserves nothing; it becomes
``pending`` when they allow it, or ``cancelled`` when a dependency can no longer be met.

Every state change goes through :func:`check_transition`, called by the model's
validator on ``Job.state``, so an illegal transition cannot be written.
"""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    BLOCKED = "blocked"  # waiting for dependencies / an array slot; never dispatched, holds nothing
    PENDING = "pending"  # accepted by the gateway, not yet sent to a backend
    DISPATCHING = "dispatching"  # claimed by a dispatcher, submission in flight
    QUEUED = "queued"  # accepted by the backend, waiting for the whole gang; holds no GPU
    STARTING = "starting"  # whole gang admitted/allocated, workers not all running yet
    RUNNING = "running"  # every worker running
    REQUEUED = "requeued"  # preempted / evicted / requeued by the backend
    CANCELLING = "cancelling"  # cancel asked; waiting for the backend to confirm
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

_S = JobState
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.BLOCKED: frozenset({_S.PENDING, _S.CANCELLED}),
    _S.PENDING: frozenset({_S.DISPATCHING, _S.CANCELLED, _S.FAILED}),
    _S.DISPATCHING: frozenset({_S.PENDING, _S.QUEUED, _S.STARTING, _S.RUNNING, _S.SUCCEEDED,
                               _S.FAILED, _S.CANCELLED, _S.CANCELLING}),
    # -> PENDING from a backend state: the attempt failed and the gateway runs the job again
    # (gateway/domain/retry.py, docs/recovery.md).
    _S.QUEUED: frozenset({_S.STARTING, _S.RUNNING, _S.REQUEUED, _S.SUCCEEDED, _S.FAILED,
                          _S.CANCELLED, _S.CANCELLING, _S.PENDING}),
    _S.STARTING: frozenset({_S.QUEUED, _S.RUNNING, _S.REQUEUED, _S.SUCCEEDED, _S.FAILED,
                            _S.CANCELLED, _S.CANCELLING, _S.PENDING}),
    _S.RUNNING: frozenset({_S.REQUEUED, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.CANCELLING, _S.PENDING}),
    _S.REQUEUED: frozenset({_S.QUEUED, _S.STARTING, _S.RUNNING, _S.SUCCEEDED, _S.FAILED,
                            _S.CANCELLED, _S.CANCELLING, _S.PENDING}),
    _S.CANCELLING: frozenset({_S.CANCELLED, _S.SUCCEEDED, _S.FAILED}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    def __init__(self, current: JobState, target: JobState):
        super().__init__(f"illegal job state transition {current.value} -> {target.value}")
        self.current = current
        self.target = target


def can_transition(current: JobState, target: JobState) -> bool:
    return target in TRANSITIONS[current]


def check_transition(current: JobState | None, target: JobState) -> None:
    if current is None:
        if target not in (JobState.PENDING, JobState.BLOCKED):
            raise IllegalTransition(JobState.PENDING, target)
        return
    if not can_transition(current, target):
        raise IllegalTransition(current, target)
