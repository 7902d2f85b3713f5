"""What a backend's status does to a job: its state, its attempts and retries, the ledger's charges.

The reconciler's polls and the watcher's change feeds both hand a status here
(``Outcomes.apply_status``); what it means is the pure ``gateway/domain/status.py``, what is
written for it (the transition, the attempt, the charge or release) is this module's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from adapters.base import (
    BackendError,
    BackendState,
    Feature,
    JobNotFound,
    JobStatus,
    features_of,
)
from gateway.dispatch.common import RECONCILER, log
from gateway.dispatch.keeper import OutputKeeper
from gateway.domain import nodehealth, retry
from gateway.domain.states import JobState
from gateway.domain.status import (
    Seen,
    absence,
    held_since,
    hold_failure_reason,
    hold_verdict,
    meaning,
    step,
)
from gateway.jobs import preemption
from gateway.jobs import service as jobs
from gateway.kit.db import transaction
from gateway.kit.logs import with_job_id
from gateway.kit.timeutil import as_utc
from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from gateway.ledger import service as ledger
from gateway.ledger.decayed import Ledger
from gateway.models.jobs import Job, JobEvent
from gateway.models.specs import spec_of


class Outcomes:
    """Records what a backend says about one job (status.py gives the meaning): the state
    change, a requeue, a retry, a hold that lasted too long, the end and its ledger charge.
    Keeps the count of polls that found a job missing, which decides when it is lost."""

    def __init__(self, *, sessions, backends: dict, settings, clock, output: OutputKeeper, recent_ends,
                 wake: Callable[[], None]) -> None:
        self.sessions = sessions
        self.backends = backends
        self.settings = settings
        self.clock = clock
        self.output = output  # keeps a job's output where its pool deletes it with the job
        self.recent_ends = recent_ends  # gangs this process saw end lately, for the claim's planner
        self._wake = wake  # the polling thread's: a cancel needs its active call on the backend
        self._misses: dict[str, tuple[int, float]] = {}  # job id -> (JobNotFound count, first miss)

    def missing(self, job_id: str) -> bool:
        """Whether the last poll of ``job_id`` did not find it (the next poll must ask again)."""
        return job_id in self._misses

    @with_job_id
    def apply_status(self, job_id: str, status: JobStatus | None, *, via: str = "poll") -> int:
        """Record what the backend says about one job; charge the ledger from real times.

        ``via`` ("poll" or "watch") is kept on the job's events: how the change was seen.
        """
        with transaction(self.sessions) as s:
            job = s.get(Job, job_id, with_for_update=True)
            if job is None or JobState(job.state).final:
                return 0
            now = self.clock()
            if status is None:
                gone = absence(JobState(job.state))
                if gone == "cancelled":
                    return self._finish(s, job, JobState.CANCELLED, "cancelled (no job left on the backend)",
                                        None, now, None)
                if gone == "wait" or not self._missing_long_enough(job.id):
                    return 0  # one miss is not a loss (backend restarting, a stale listing)
                return self._finish(s, job, JobState.FAILED, f"job disappeared from {job.pool}", None, now,
                                    job.started_at)
            seen = meaning(state=JobState(job.state), started_at=as_utc(job.started_at),
                           backend_job_id=job.backend_job_id, status=status, now=now,
                           cancel_requested_at=as_utc(job.cancel_requested_at))
            if seen.foreign:
                # Not the submission the registry recorded (e.g. a job someone else submitted
                # with this gateway id in its comment): it says nothing about this job.
                log.warning("ignoring %s job %s: job %s is recorded as %s job %s", job.pool,
                            status.backend_job_id, job.id, job.pool, job.backend_job_id)
                return 0
            self._misses.pop(job.id, None)
            # Only statuses the adapter matched to our submission get here (find_by_gateway_id
            # with the job's request); the watch defers jobs without a recorded id.
            # The nodes a gang ran on are those seen while it ran: an ended Slurm job drops a
            # node that failed under it from its node list.
            jobs.observe(job, backend_job_id=status.backend_job_id,
                         nodes=None if status.state.final and job.nodes else list(status.nodes))
            target, reason = seen.target, seen.reason
            if seen.awaiting_cancel:
                return 0  # still waiting for the backend to confirm the cancel
            if seen.requeued_at is not None:
                # Requeued or preempted on the backend (docs/dispatch.md, "Requeues").
                changed = self._requeue(s, job, status, seen.requeue_reason, seen.requeued_at, now, via)
                if job.state != JobState.REQUEUED.value or not seen.after_requeue:
                    return changed
                # ... and running again (or ended) already: record that run below.
            if target.final and job.borrowed and job.cancel_requested_at is None \
                    and job.state != JobState.CANCELLING.value:
                stopped = preemption.current(s, job)
                if stopped is not None and stopped.signalled_at is not None:
                    # The gateway signalled it to reclaim its borrowed GPUs: whatever it exited
                    # with, the attempt was preempted (docs/recovery.md, "Reclaim").
                    return self._preempted(s, job, status, stopped, reason, now, via)
            if (target is JobState.FAILED and status.state is BackendState.FAILED and job.cancel_requested_at is None
                    and job.state != JobState.CANCELLING.value):
                cause = retry.verdict(retry.policy_of(spec_of(job), self.settings.retry_max_attempts),
                                      attempt=self._failures(s, job), failure=status.failure,
                                      exit_code=status.exit_code)
                if cause is not None:
                    return self._retry(s, job, status, cause, reason, now, via)
            if target == JobState.RUNNING and job.started_at is None:
                jobs.mark_started(job, self._run_start(s, job, as_utc(status.started_at) or now))
                ledger.record_start(s, job=job, started_at=job.started_at, actor=RECONCILER)
            how = step(JobState(job.state), target)
            if how == "finish":
                started = job.started_at or self._run_start(s, job, as_utc(status.started_at), final=True)
                ended = as_utc(status.ended_at) or now
                if started and job.started_at is None:
                    jobs.mark_started(job, started)
                return self._finish(s, job, target, reason, status.exit_code, ended, started, status, via=via)
            data = {"raw_state": status.raw_state, "via": via}
            if status.held:
                data["held"] = status.held  # when the hold began (held_since) is read back from this
            if how == "note":
                changed = int(jobs.note_backend(s, job, reason=reason, actor=RECONCILER, data=data))
            else:
                jobs.set_state(s, job, target, actor=RECONCILER, reason=reason,
                               data={**data, "nodes": list(status.nodes), "allocated_gpus": status.allocated_gpus})
                changed = 1
            if status.held:
                changed = max(changed, self._held(s, job, status, reason, now, via))
            return changed

    def _held(self, s: Session, job: Job, status: JobStatus, reason: str, now: datetime, via: str) -> int:
        """A job its backend holds for something only an administrator can fix (``status.held``).

        Once held for ``held_job_fail_after_s`` it is cancelled on the backend (no gang may
        start there unseen by the ledger) and failed with the backend's reason, in the user's
        words; the ledger releases its reservation (docs/dispatch.md, "Jobs held for an
        unknown user"). Returns 1 when the job changed.
        """
        bound = self.settings.held_job_fail_after_s
        history = [Seen(at=ev.at, state_change=ev.kind == "state", held=str((ev.data or {}).get("held") or ""))
                   for ev in s.scalars(select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id))]
        since = held_since(history)
        if since is None and bound:
            # Held with the same words as before any hold was recorded (e.g. seen by an
            # older gateway): the clock starts now.
            jobs.record_event(s, job, actor=RECONCILER, kind="backend", reason=reason,
                              data={"raw_state": status.raw_state, "via": via, "held": status.held})
            return 0
        if hold_verdict(state=JobState(job.state), held=status.held, since=since, now=now, bound_s=bound) != "fail":
            return 0
        backend = self.backends.get(job.pool or "")
        if backend is None:
            return 0
        after: JobStatus | None = None
        try:
            backend.cancel(status.backend_job_id)
            after = backend.status(status.backend_job_id)
        except JobNotFound:
            pass
        except BackendError as exc:  # not cancelled for sure: keep the job, try again next round
            log.warning("cancel held %s job %s (job %s): %s", job.pool, status.backend_job_id, job.id, exc.message)
            return 0
        # Should the launch have succeeded meanwhile, the gang ran: charge it, never lose it.
        started = as_utc(after.started_at) if after is not None and after.nodes else None
        ended = (as_utc(after.ended_at) if after is not None and after.state.final else None) or now
        why = hold_failure_reason(reason, pool=job.pool or "", held_s=(now - since).total_seconds(), bound_s=bound)
        return self._finish(s, job, JobState.FAILED, why, None, ended, started, after or status, via=via)

    def _requeue(self, s: Session, job: Job, status: JobStatus, reason: str, at: datetime, now: datetime,
                 via: str) -> int:
        """A running gang was taken down at ``at`` and queued again: charge what it ran, re-admit it.

        Its next run is admitted again against the account's GPU-hour budgets; a job that no
        longer fits is cancelled (on the backend too) with the budget's words as the reason.
        """
        started = as_utc(job.started_at) or at
        outcome = Ledger.of(self.settings).requeue(s, job=job, started_at=started, requeued_at=at, actor=RECONCILER,
                                                   now=now)
        ran_s = int((at - started).total_seconds())
        # The run that ended is an attempt of its own, under the job's retry policy (docs/recovery.md,
        # "Backend preemption"): the backend runs the same backend job again, the gateway counts it.
        cause = retry.NODE_FAILURE if status.failure == retry.NODE_FAILURE else retry.PREEMPTED
        policy = retry.policy_of(spec_of(job), self.settings.retry_max_attempts)
        again = retry.verdict(policy, attempt=self._failures(s, job), failure=cause, exit_code=None)
        ended = jobs.end_attempt(s, job, outcome=cause, started_at=started, ended_at=at, exit_code=None,
                                 backend_reason=f"requeued by {job.pool}: {reason}",
                                 charged_gpu_seconds=outcome.charged_gpu_seconds,
                                 failed_nodes=self._failed_nodes(job, cause, status))
        jobs.clear_run(job)  # the next RUNNING records the new start
        jobs.set_state(s, job, JobState.REQUEUED, actor=RECONCILER,
                       reason=f"requeued by {job.pool} after running {ran_s} s: {reason}; attempt {ended.number} "
                              f"ended ({cause.replace('_', ' ')}), attempt {job.attempt} waits on {job.pool}",
                       data={"raw_state": status.raw_state, "ran_s": ran_s, "attempt": ended.number,
                             "outcome": cause, "charged_gpu_seconds": outcome.charged_gpu_seconds,
                             "requeued_at": at.isoformat(), "via": via})
        refusal = outcome.over_budget and f"over budget: {outcome.over_budget}"
        if again is None:
            refusal = f"its retry policy ({policy.words()}) does not run a {cause.replace('_', ' ')} attempt again"
        if refusal:
            jobs.set_state(s, job, JobState.CANCELLING, actor=RECONCILER,
                           reason=f"cancelled at requeue: {refusal}",
                           data={"over_budget": outcome.over_budget, "via": via} if outcome.over_budget
                           else {"retry": policy.words(), "via": via})
            self._wake()  # the polling thread cancels it on the backend now
        return 1

    def _failures(self, s: Session, job: Job) -> int:
        """The attempts that ended by a failure, the current one included (retry.verdict's count:
        preempted attempts are not counted)."""
        return 1 + sum(1 for a in jobs.attempts_of(s, job.id) if a.outcome != retry.PREEMPTED)

    def _preempted(self, s: Session, job: Job, status: JobStatus, stopped, reason: str, now: datetime,
                   via: str) -> int:
        """A victim of reclaim ended: run it again under its retry policy, saying who preempted it and why."""
        preemption.close(s, job.id, job.attempt, at=now)
        who = (f"preempted to start {stopped.preemptor_account}'s job {stopped.preemptor_id} within its guarantee "
               f"on {job.pool} (this job ran on borrowed GPUs; {stopped.gpu_hours_at_risk:.2f} GPU-hours since its "
               f"last checkpoint were at risk)")
        policy = retry.policy_of(spec_of(job), self.settings.retry_max_attempts)
        if retry.verdict(policy, attempt=self._failures(s, job), failure=retry.PREEMPTED,
                         exit_code=status.exit_code) is not None:
            return self._retry(s, job, status, retry.PREEMPTED, reason, now, via, words=who)
        started = job.started_at or self._run_start(s, job, as_utc(status.started_at), final=True)
        return self._finish(s, job, JobState.FAILED, f"{who}; its retry policy ({policy.words()}) does not run it "
                                                     "again", status.exit_code, as_utc(status.ended_at) or now,
                            started, status, via=via)

    def _retry(self, s: Session, job: Job, status: JobStatus, cause: str, reason: str, now: datetime,
               via: str, words: str = "") -> int:
        """The attempt failed the way the job's retry policy runs again (docs/recovery.md):
        charge its run as any run is charged (queue time never), record the attempt, and queue
        the next one in the gateway, where routing and admission decide afresh."""
        started = job.started_at or self._run_start(s, job, as_utc(status.started_at), final=True)
        ended = as_utc(status.ended_at) or now
        if started is not None:
            # A short run can start and end between two rounds: record its start too.
            ledger.record_start(s, job=job, started_at=started, actor=RECONCILER)
        before = sum(a.charged_gpu_seconds for a in jobs.attempts_of(s, job.id))
        Ledger.of(self.settings).record_finish(s, job=job, started_at=started, ended_at=ended, actor=RECONCILER,
                                               retried=True)
        charged = ledger_rules.charged_gpu_seconds(s, job_id=job.id) - before
        policy = retry.policy_of(spec_of(job), self.settings.retry_max_attempts)
        number, pool = job.attempt, job.pool
        nodes = list(job.nodes or []) or list(status.nodes)
        job.nodes = nodes or None
        words = words or ("a node failed under it" if cause == retry.NODE_FAILURE
                          else f"it exited with code {status.exit_code}")
        bound = ("(preemptions are not counted in its attempts)" if cause == retry.PREEMPTED
                 else f"of at most {policy.max_attempts}")
        jobs.retry(s, job, outcome=cause, started_at=started, ended_at=ended, exit_code=status.exit_code,
                   backend_reason=reason, charged_gpu_seconds=charged, actor=RECONCILER,
                   failed_nodes=self._failed_nodes(job, cause, status),
                   reason=f"attempt {number} on {pool} ended: {words} ({reason}); "
                          f"attempt {number + 1} {bound} waits for its turn",
                   data={"raw_state": status.raw_state, "nodes": nodes, "charged_gpu_seconds": charged, "via": via})
        self._wake()  # the dispatcher routes it again now
        return 1

    def _failed_nodes(self, job: Job, cause: str, status: JobStatus | None) -> tuple[str, ...]:
        """Of the nodes an attempt that a node failure ended ran on, the ones to blame
        (gateway/domain/nodehealth.py): those its backend has out of service now
        (Feature.NODE_HEALTH). () when it names none: then every node shares the blame. (The
        node list of Slurm's ended job is no guide: it is not the gang's less the failed node.)"""
        if cause not in nodehealth.INFRASTRUCTURE or not job.nodes:
            return ()
        blamed: set[str] = set()
        backend = self.backends.get(job.pool or "")
        if backend is not None and features_of(backend).has(Feature.NODE_HEALTH):
            try:
                problems = backend.node_problems()
            except BackendError as exc:
                log.warning("node states of %s unknown (%s) at the failure of job %s", job.pool, exc.message, job.id)
                problems = {}
            blamed |= {n for n in job.nodes if n in problems}
        return tuple(n for n in job.nodes if n in blamed)

    def _run_start(self, s: Session, job: Job, started: datetime | None, *, final: bool = False) -> datetime | None:
        """The start of the current run: never before the job's last requeue.

        A backend may still report the first run's start after a requeue. For a running job
        the run began at the requeue at the earliest; for a job that ended, an older start
        means it never ran again.
        """
        if started is None:
            return None
        requeued_at = ledger_reading.last_requeue_at(s, job_id=job.id)
        if requeued_at is None or started >= requeued_at:
            return started
        return None if final else requeued_at

    LOST_AFTER_MISSES = 3
    LOST_AFTER_S = 10.0

    def _missing_long_enough(self, job_id: str) -> bool:
        count, first = self._misses.get(job_id, (0, time.monotonic()))
        self._misses[job_id] = (count + 1, first)
        return count + 1 >= self.LOST_AFTER_MISSES and time.monotonic() - first >= self.LOST_AFTER_S

    def _finish(self, s: Session, job: Job, target: JobState, reason: str, exit_code: int | None,
                ended: datetime, started: datetime | None, status: JobStatus | None = None, *,
                via: str = "poll") -> int:
        exit_code = jobs.final_exit_code(target, exit_code)
        if started is not None:
            # A short job can start and end between two rounds: record its start too.
            ledger.record_start(s, job=job, started_at=started, actor=RECONCILER)
            Ledger.of(self.settings).record_finish(s, job=job, started_at=started, ended_at=ended, actor=RECONCILER)
        elif ledger_reading.last_requeue_at(s, job_id=job.id) is not None:
            # Ended while requeued: its earlier runs were charged; close the reservation as
            # finished (not released) so that usage stays on record and refundable.
            Ledger.of(self.settings).record_finish(s, job=job, started_at=None, ended_at=ended, actor=RECONCILER)
        else:
            ledger.release(s, job=job, actor=RECONCILER, reason=f"ended without starting: {reason}")
        data = {"exit_code": exit_code, "via": via}
        if status is not None:
            data.update(raw_state=status.raw_state, nodes=list(status.nodes))
        if job.borrowed:  # only borrowed attempts are ever preempted: close one still open
            preemption.close(s, job.id, job.attempt, at=ended)
        outcome = nodehealth.outcome_of(target.value, failure=status.failure if status is not None else "",
                                        exit_code=exit_code, seen=status is not None)
        failed, charged = (), 0
        if outcome in nodehealth.INFRASTRUCTURE and job.nodes:
            # What the failure cost goes on the nodes' record (docs/recovery.md, "Node health").
            failed = self._failed_nodes(job, outcome, status)
            charged = ledger_rules.charged_gpu_seconds(s, job_id=job.id) - sum(
                a.charged_gpu_seconds for a in jobs.attempts_of(s, job.id))
        jobs.finish(s, job, target, ended_at=ended, actor=RECONCILER, reason=reason, exit_code=exit_code, data=data,
                    outcome=outcome, failed_nodes=failed, charged_gpu_seconds=charged)
        if job.pool:
            self.recent_ends.append((job.pool, job.workers, job.held_gpus or job.total_gpus, time.monotonic()))
        self.output.forget(job.id)
        backend = self.backends.get(job.pool or "")
        if backend is not None:
            self.output.keep(backend, job.id, job.backend_job_id, job.workers)
        return 1
