"""Submission: the backend call, outside any transaction, idempotent by the gateway job id."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from adapters.base import (
    BackendError,
    BackendForbidden,
    BackendUnavailable,
    SubmitRequest,
    Unsupported,
)
from gateway.dispatch.common import (
    ACTOR,
    NO_LAUNCH,
    Launch,
    first_attempt,
    log,
    submit_request,
)
from gateway.dispatch.faults import NONE, Faults
from gateway.domain.states import JobState
from gateway.jobs import service as jobs
from gateway.kit.db import transaction
from gateway.kit.logs import with_job_id
from gateway.ledger import service as ledger
from gateway.models.jobs import Job


class Submitter:
    """The backend calls of claimed jobs, outside any transaction, and what follows from them."""

    def __init__(self, *, sessions, backends: dict, settings, clock, capacity, deferred, apply_status,
                 launch: Launch = NO_LAUNCH, faults: Faults = NONE) -> None:
        self.faults = faults
        self.launch = launch
        self.sessions = sessions
        self.backends = backends
        self.settings = settings
        self.clock = clock
        self.capacity = capacity
        self.deferred = deferred  # watch statuses seen before a submission was recorded (feeds.Deferred)
        self.apply_status = apply_status  # Reconciler.apply_status

    def submit_all(self, job_ids: list[str], *, recovering: bool = False,
                    prepared: dict[str, tuple[str, SubmitRequest]] | None = None) -> None:
        """Submit claimed jobs concurrently: each is idempotent and records itself."""
        prepared = prepared or {}
        if len(job_ids) <= 1 or self.settings.dispatch_concurrency == 1:
            for job_id in job_ids:
                self.submit_claimed(job_id, recovering=recovering, prepared=prepared.get(job_id))
            return
        workers = min(self.settings.dispatch_concurrency, len(job_ids))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="isthmus-submit") as pool:
            for future in [pool.submit(self.submit_claimed, j, recovering=recovering, prepared=prepared.get(j))
                           for j in job_ids]:
                future.result()

    @with_job_id
    def submit_claimed(self, job_id: str, *, recovering: bool = False,
                       prepared: tuple[str, SubmitRequest] | None = None) -> None:
        """Submit one claimed job and record the backend's id (idempotent by gateway id).

        ``prepared`` = (pool, request) built in the claim transaction that just committed
        saves re-reading the job; a cancel arriving meanwhile is handled after the submit,
        as one arriving during it is.
        """
        if prepared is not None:
            pool, request = prepared
        else:
            self.launch.prime()
            with transaction(self.sessions) as s:
                job = s.get(Job, job_id)
                if job is None or job.state not in (JobState.DISPATCHING.value, JobState.CANCELLING.value):
                    return
                if job.backend_job_id:
                    return
                pool, request = job.pool, submit_request(job, first_attempt=first_attempt(job, recovering),
                                                         launch=self.launch)
        backend = self.backends.get(pool or "")
        if backend is None:
            return
        try:
            result = backend.submit(request)
        except BackendUnavailable as exc:
            self._after_outage(job_id, pool, exc)
            self.deferred.take(job_id)  # the retry records (or adopts) the submission afresh
            return
        except (BackendForbidden, Unsupported, BackendError) as exc:
            self._after_rejection(job_id, pool, exc)
            self.deferred.take(job_id)
            return
        self.faults.after_submit()  # crash window 2 (tests only: dispatch/faults.py)
        how = "adopted existing" if result.adopted else "submitted as"
        avoiding = (f"; avoiding node(s) {', '.join(request.exclude_nodes)} (docs/recovery.md, \"Node health\")"
                    if request.exclude_nodes else "")
        with transaction(self.sessions) as s:
            final = jobs.record_submission(s, job_id=job_id, backend_job_id=result.backend_job_id, actor=ACTOR,
                                           reason=f"{how} {pool} job {result.backend_job_id}{avoiding}",
                                           data={"backend_job_id": result.backend_job_id, "adopted": result.adopted,
                                                 "excluded_nodes": list(request.exclude_nodes)})
        if final:
            # Cancelled while the submission was in flight: do not leave it running.
            try:
                backend.cancel(result.backend_job_id)
            except BackendError as exc:
                log.warning("could not cancel %s on %s after a cancel: %s", job_id, pool, exc.message)
        self._apply_deferred(job_id)

    def _apply_deferred(self, job_id: str) -> None:
        """The watch may have seen the job move on while its submission was being recorded."""
        deferred = self.deferred.take(job_id)
        if deferred is not None:
            self.apply_status(job_id, deferred, via="watch")

    def _backoff_s(self, attempts: int) -> float:
        base = self.settings.retry_backoff_base_s * (2 ** max(0, attempts - 1))
        return min(self.settings.retry_backoff_max_s, base) * random.uniform(0.8, 1.2)

    def _after_outage(self, job_id: str, pool: str, exc: BackendError) -> None:
        """Backend down: the job goes back to pending (reservation released) and is retried.

        The submission may have reached the backend before the outage; the retry's
        idempotent submit adopts it, so nothing is doubled.
        """
        with transaction(self.sessions) as s:
            job = s.get(Job, job_id, with_for_update=True)
            now = self.clock()
            delay = self._backoff_s(job.dispatch_attempts)
            retry_at = now + timedelta(seconds=delay)
            if job.state == JobState.DISPATCHING.value:
                ledger.release(s, job=job, actor=ACTOR, reason=f"{pool} unavailable")
                jobs.return_to_pending(s, job, retry_at=retry_at, actor=ACTOR,
                                       reason=f"{pool} unavailable ({exc.message}); retry in {delay:.0f} s")
            else:  # cancelling: the reconciler finishes it once the backend answers
                jobs.defer_retry(s, job, retry_at=retry_at, actor=ACTOR, reason=f"{pool} unavailable: {exc.message}")
        self.capacity.invalidate()

    def _after_rejection(self, job_id: str, pool: str, exc: BackendError) -> None:
        with transaction(self.sessions) as s:
            job = s.get(Job, job_id, with_for_update=True)
            ledger.release(s, job=job, actor=ACTOR, reason=f"rejected by {pool}")
            target = JobState.CANCELLED if job.state == JobState.CANCELLING.value else JobState.FAILED
            jobs.finish(s, job, target, ended_at=self.clock(), actor=ACTOR, reason=f"rejected by {pool}: {exc.message}")
