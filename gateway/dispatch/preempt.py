"""The preemptor: carries out what a dispatch round's reclaim chose (docs/recovery.md, "Reclaim").

Each victim recorded in ``job_preemption`` (gateway/jobs/preemption.py) is, in turn:

1. **signalled**: ``Backend.preempt`` (Slurm: ``SIGUSR1`` to the batch shell and its tasks;
   Kubernetes: the Job suspended and its pods deleted with the grace period as their
   ``terminationGracePeriodSeconds``: ``SIGTERM`` now, ``SIGKILL`` at the deadline);
2. **stopped** at its deadline, on a backend that does not stop it by itself (Slurm: the
   gateway cancels it: ``SIGTERM`` to its steps, ``SIGKILL`` after the cluster's KillWait),
   unless the job it makes room for stopped waiting meanwhile: then the reclaim is **called
   off** (an event on the victim says why) and the victim keeps running.

The reconciler sees the attempt end and runs the job again under its retry policy
(``Reconciler.apply_status``); a preemption whose job no longer runs that attempt is closed
here. Backend calls happen outside any transaction; a failed call is tried again next round.
"""

from __future__ import annotations

from datetime import timedelta

from adapters.base import BackendError, Feature, features_of
from gateway.dispatch.common import ACTOR, log
from gateway.domain.states import JobState
from gateway.jobs import preemption
from gateway.kit.db import transaction
from gateway.kit.timeutil import as_utc

# A stop that did not take (the backend still runs the job) is asked again this often.
RESTOP_S = 30.0


class Preemptor:
    def __init__(self, *, sessions, backends: dict, settings, clock) -> None:
        self.sessions = sessions
        self.backends = backends
        self.settings = settings
        self.clock = clock

    def preempt_round(self) -> int:
        """Signal the victims not yet signalled, stop those past their deadline; returns the calls made."""
        with transaction(self.sessions) as s:
            work = [(p.job_id, p.attempt, as_utc(p.deadline), p.signalled_at, as_utc(p.stopped_at), job.state,
                     job.attempt, job.backend_job_id, job.pool,
                     preemption.reason_gone(s, p) if p.stopped_at is None else None)
                    for p, job in preemption.open_preemptions(s)]
        calls = 0
        for job_id, attempt, deadline, signalled_at, stopped_at, state, current, backend_job_id, pool, gone in work:
            now = self.clock()
            if current != attempt or JobState(state).final:
                with transaction(self.sessions) as s:  # ended (and retried) without the reconciler closing it
                    preemption.close(s, job_id, attempt, at=now)
                continue
            if gone is not None:  # the job it made room for stopped waiting: the victim is not stopped
                with transaction(self.sessions) as s:
                    preemption.call_off(s, job_id, attempt, at=now, actor=ACTOR, why=gone)
                continue
            backend = self.backends.get(pool or "")
            if backend is None or not backend_job_id or state != JobState.RUNNING.value:
                continue  # not submitted yet, or cancelling: the cancel path ends it
            try:
                if signalled_at is None:
                    grace = max(0.0, (deadline - now).total_seconds())
                    # A backend that can warn the job first does; the gateway cancels it at the
                    # deadline. Any other stops it now, with the grace period if it can.
                    warns = features_of(backend).has(Feature.PREEMPT_SIGNAL)
                    words = backend.signal_preempt(backend_job_id, grace) if warns else backend.preempt(
                        backend_job_id, grace)
                    with transaction(self.sessions) as s:
                        preemption.signalled(s, job_id, attempt, at=now, actor=ACTOR, words=words)
                        if not warns:
                            preemption.stopped(s, job_id, attempt, at=now, actor=ACTOR,
                                               words=f"{pool} stops it itself at the end of the grace period")
                    calls += 1
                elif now >= deadline and (stopped_at is None or now - stopped_at >= timedelta(seconds=RESTOP_S)):
                    backend.cancel(backend_job_id)
                    with transaction(self.sessions) as s:
                        preemption.stopped(s, job_id, attempt, at=now, actor=ACTOR,
                                           words=f"grace period over: {pool} job {backend_job_id} cancelled")
                    calls += 1
            except BackendError as exc:
                log.warning("preempting job %s on %s: %s; trying again", job_id, pool, exc.message)
        return calls
