"""The control loop: fair-share dispatch, routing, submission, reconciliation, recovery.

Exactly-once dispatch rests on three rules (docs/dispatch.md):

1. A job is claimed (pending -> dispatching, ledger reservation, routing decision) in ONE
   transaction, with ``FOR UPDATE SKIP LOCKED`` on Postgres so concurrent dispatchers
   never claim the same row. The claim carries a lease (``next_attempt_at``).
2. The backend call happens outside any transaction and is idempotent by the gateway job
   id: adapters look the id up on the backend before creating anything.
3. A claim whose process died (lease expired while still ``dispatching``) is re-driven by
   any dispatcher: the idempotent submit adopts the backend job if it exists.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, object_session, sessionmaker

from adapters.base import (
    Backend,
    BackendError,
    BackendForbidden,
    BackendState,
    BackendUnavailable,
    Feature,
    JobNotFound,
    JobStatus,
    SubmitRequest,
    Unsupported,
)
from gateway.accounts.models import Account
from gateway.jobs import service as jobs
from gateway.jobs.models import Job
from gateway.jobs.schemas import parse_memory_mib
from gateway.jobs.states import JobState, can_transition
from gateway.kit.db import transaction
from gateway.kit.errors import QuotaExceeded
from gateway.kit.logs import with_job_id
from gateway.kit.settings import Settings
from gateway.kit.timeutil import as_utc, utcnow
from gateway.ledger import service as ledger
from gateway.ledger.models import Reservation
from gateway.pools.service import pool_meta
from gateway.routing.service import JobShape, PoolView, held_gpus, parse_weights, route, take

log = logging.getLogger("isthmus.dispatch")

ACTOR = "system:dispatcher"
RECONCILER = "system:reconciler"

BACKEND_TO_JOB = {
    BackendState.QUEUED: JobState.QUEUED,
    BackendState.STARTING: JobState.STARTING,
    BackendState.RUNNING: JobState.RUNNING,
    BackendState.REQUEUED: JobState.REQUEUED,
    BackendState.SUCCEEDED: JobState.SUCCEEDED,
    BackendState.FAILED: JobState.FAILED,
    BackendState.CANCELLED: JobState.CANCELLED,
}
FOLLOWED = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.REQUEUED, JobState.CANCELLING)


def _is_deadlock(exc: OperationalError) -> bool:
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "40P01"


def submit_request(job: Job, *, first_attempt: bool = False) -> SubmitRequest:
    spec = job.spec
    # The backend priority class is the account's (an admin setting), never the user's choice.
    account = object_session(job).get(Account, job.account_name)
    return SubmitRequest(
        gateway_job_id=job.id, name=job.name, account=job.account_name, user=job.username,
        # A gang charged for whole nodes gets every GPU of them (held_gpus, set at the claim):
        # without --gres, Slurm's --exclusive blocks the node's GPUs but gives the job none.
        command=list(spec["command"]), workers=job.workers,
        gpus_per_worker=max(job.gpus_per_worker, (job.held_gpus or 0) // max(job.workers, 1)),
        cpus_per_worker=int(spec.get("cpus_per_worker", 1)),
        memory_mib_per_worker=parse_memory_mib(spec.get("memory_per_worker", "4Gi")),
        time_limit_s=job.time_limit_s, image=spec.get("image"), gpu_type=spec.get("gpu_type"),
        env=dict(spec.get("env") or {}), labels=dict(spec.get("labels") or {}), priority=job.priority,
        priority_class=account.priority_class if account is not None else None,
        first_attempt=first_attempt, submitted_after=as_utc(job.created_at),
    )


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


# A loose index scan over ix_job_queue: one index probe per account with pending jobs,
# instead of reading every pending row (100,000 rows -> ~1,000 probes). Works on SQLite too.
_ACCOUNTS_WITH_PENDING = text("""
WITH RECURSIVE acc(name) AS (
    SELECT (SELECT account_name FROM job WHERE state = :state ORDER BY account_name LIMIT 1)
    UNION ALL
    SELECT (SELECT account_name FROM job WHERE state = :state AND account_name > acc.name
            ORDER BY account_name LIMIT 1)
    FROM acc WHERE acc.name IS NOT NULL
)
SELECT name FROM acc WHERE name IS NOT NULL
""")


def accounts_with_pending(session: Session) -> list[str]:
    return list(session.execute(_ACCOUNTS_WITH_PENDING, {"state": JobState.PENDING.value}).scalars())


def pending_order(session: Session, *, now: datetime, limit: int, lock: bool,
                  factors: dict[str, float]) -> list[Job]:
    """The next ``limit`` dispatchable pending jobs in fair-share order.

    Accounts by fair-share factor (highest first), within an account by priority then
    age. Uses the (state, account_name, priority, id) index: one small query per account
    with pending work, never a scan of every pending job.
    """
    due = or_(Job.next_attempt_at.is_(None), Job.next_attempt_at <= now)
    accounts = sorted(accounts_with_pending(session), key=lambda a: (-factors.get(a, 0.0), a))
    picked: list[Job] = []
    for account in accounts:
        if len(picked) >= limit:
            break
        stmt = (select(Job).where(Job.state == JobState.PENDING.value, Job.account_name == account, due)
                .order_by(Job.priority.desc(), Job.id).limit(limit - len(picked)))
        if lock:
            stmt = stmt.with_for_update(skip_locked=True)
        picked.extend(session.scalars(stmt))
    return picked


class Dispatcher:
    def __init__(self, *, sessions: sessionmaker[Session], backends: dict[str, Backend], settings: Settings,
                 clock: Callable[[], datetime] = utcnow):
        self.sessions = sessions
        self.backends = backends
        self.settings = settings
        self.clock = clock
        self.weights = parse_weights(settings.routing_weights)
        self._views: dict[str, PoolView] = {}
        self._views_at = 0.0
        self._misses: dict[str, tuple[int, float]] = {}  # job id -> (JobNotFound count, first miss)
        self._limited: dict[str, bool] = {}  # account -> a limit is set in its chain (per dispatch round)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._reconcile_wake = threading.Event()
        self._thread: threading.Thread | None = None
        # Backends with a change feed are followed by one watch thread each (docs/dispatch.md).
        self.watched = [name for name, b in backends.items() if b.supports(Feature.WATCH)]
        self._feeds: dict[str, tuple[object, bool]] = {}  # pool -> (open feed, resumed from a position)
        self._watch_stops: set[threading.Event] = set()
        self._resynced_at: dict[str, float] = {}  # pool -> monotonic time of its last full poll
        self._poll_due = 0.0  # monotonic time of the reconciler's next polling round
        self._accrue_due = 0.0  # ... and of its next usage-accrual round
        # Watch events for jobs whose submission the dispatcher has not recorded yet.
        self._deferred: dict[str, JobStatus] = {}
        self._deferred_lock = threading.Lock()

    # --------------------------------------------------------------- capacity

    def views(self, *, fresh: bool = False) -> dict[str, PoolView]:
        if fresh or time.monotonic() - self._views_at > self.settings.capacity_ttl_s or not self._views:
            depth, meta = self._queue_depths()
            self._views = {name: PoolView.snapshot(name, b, depth.get(name, 0), meta.get(name))
                           for name, b in self.backends.items()}
            self._views_at = time.monotonic()
        return self._views

    def _queue_depths(self) -> tuple[dict[str, int], dict[str, dict]]:
        """Jobs queued per pool, and each pool's row (kind, state, weight, cost, GPU types)."""
        with transaction(self.sessions) as s:
            rows = s.execute(select(Job.backend, func.count()).where(
                Job.state.in_([JobState.DISPATCHING.value, JobState.QUEUED.value])).group_by(Job.backend)).all()
            meta = pool_meta(s)
        return {b: n for b, n in rows if b}, meta

    # ---------------------------------------------------------------- dispatch

    def dispatch_round(self) -> list[str]:
        """Claim and submit up to ``dispatch_batch`` jobs. Returns the claimed job ids."""
        if not self.backends:
            return []
        fresh_views = self.views(fresh=True)
        is_pg = not self.settings.is_sqlite
        for attempt in range(1, 4):
            views = {name: dataclasses.replace(v) for name, v in fresh_views.items()}
            now = self.clock()
            claimed: list[str] = []
            prepared: dict[str, tuple[str, SubmitRequest]] = {}
            self._limited = {}
            try:
                with transaction(self.sessions) as s:
                    factors = {name: fs.factor for name, fs in ledger.fairshare(s, now=now).items()}
                    for position, job in enumerate(pending_order(s, now=now, limit=self.settings.dispatch_batch,
                                                                lock=is_pg, factors=factors), start=1):
                        self._claim_one(s, job, views, now, position)
                        if job.state == JobState.DISPATCHING.value:
                            claimed.append(job.id)
                            prepared[job.id] = (job.backend, submit_request(
                                job, first_attempt=self._first_attempt(job, False)))
                break
            except (ledger.ChainChanged, OperationalError) as exc:
                # The account tree moved under a reservation, or two dispatchers locked two
                # account chains in opposite orders (Postgres aborts one): nothing of this
                # claim was written; claim again.
                if isinstance(exc, OperationalError) and not _is_deadlock(exc) or attempt == 3:
                    raise
                log.info("claim round %d rolled back (%s); retrying", attempt, type(exc).__name__)
        if claimed and self.settings.debug_pause_after_claim_s:
            time.sleep(self.settings.debug_pause_after_claim_s)  # crash window 1 (tests)
        self._submit_all(claimed, prepared=prepared)
        return claimed

    @staticmethod
    def _first_attempt(job: Job, recovering: bool) -> bool:
        # The first claim of a job is the only one that can have submitted it; a retry or a
        # recovery must let the adapter look for an earlier submission.
        return job.dispatch_attempts == 1 and not recovering and job.state == JobState.DISPATCHING.value

    def _submit_all(self, job_ids: list[str], *, recovering: bool = False,
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

    def _claim_one(self, s: Session, job: Job, views: dict[str, PoolView], now: datetime, position: int) -> None:
        shape = JobShape.of(job)
        verdict = ledger.budget_verdict(s, account=job.account_name, total_gpus=job.total_gpus,
                                        time_limit_s=job.time_limit_s, gpu_type=(job.spec or {}).get("gpu_type"),
                                        now=now)
        if verdict is not None and verdict[0] == "never":
            jobs.set_state(s, job, JobState.FAILED, actor=ACTOR, reason=f"cannot run: {verdict[1]}")
            job.ended_at = now
            return
        if verdict is not None:  # not this period: held with the reason, never "waiting for capacity"
            self._note_waiting(s, job, f"held: {verdict[1]}")
            return
        refusals: dict[str, str] = {}
        # What the gang would hold in each pool: whole nodes on a node-exclusive pool.
        held = {name: held_gpus(shape, view) for name, view in views.items()}
        # For a pinned job, reserve() below applies the same rule; checking first only helps
        # routing choose between pools.
        # Asked pool by pool only when a limit is set in the account's chain (once per account
        # and round: with many pools, the check per pool is most of a round's queries).
        limited = self._limited.get(job.account_name)
        if limited is None and job.requested_backend == "auto" and len(views) > 1:
            limited = self._limited[job.account_name] = ledger.chain_has_limits(s, job.account_name)
        if job.requested_backend == "auto" and len(views) > 1 and limited:
            for name in views:
                ok, why = ledger.admission_check(s, job=job, pool=name, now=now, gpus=held[name])
                if not ok:
                    refusals[name] = why
        decision = route(shape, job.requested_backend, views, quota_refusals=refusals, weights=self.weights,
                         queue_depth=self.settings.pool_queue_depth, cost_factor=self.settings.routing_cost_factor)
        if decision.rejected:
            jobs.set_state(s, job, JobState.FAILED, actor=ACTOR, reason=f"cannot run: {decision.reason}")
            job.ended_at = now
            return
        if decision.pool is None:
            self._note_waiting(s, job, f"{decision.reason} (fair-share position {position})")
            return
        try:  # reserve() writes nothing when it refuses: no savepoint needed
            ledger.reserve(s, job=job, pool=decision.pool, actor=ACTOR, now=now, gpus=held[decision.pool])
        except QuotaExceeded as exc:
            self._note_waiting(s, job, f"quota: {exc.detail}")
            return
        job.backend = decision.pool
        job.held_gpus = held[decision.pool]
        job.routing_reason = decision.reason
        job.next_attempt_at = now + timedelta(seconds=self.settings.dispatch_lease_s)
        job.dispatch_attempts += 1
        jobs.set_state(s, job, JobState.DISPATCHING, actor=ACTOR, reason=decision.reason,
                       data={"pool": decision.pool, "fairshare_position": position})
        take(shape, views[decision.pool])

    def _note_waiting(self, s: Session, job: Job, reason: str) -> None:
        """Keep the latest 'why is my job not running' on the job; an event when it changes."""
        if job.state_reason == reason:
            return
        core = reason.split(" (fair-share position")[0]
        if job.state_reason.split(" (fair-share position")[0] != core:
            jobs.record_event(s, job, actor=ACTOR, kind="waiting", reason=reason)
        job.state_reason = reason

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
            with transaction(self.sessions) as s:
                job = s.get(Job, job_id)
                if job is None or job.state not in (JobState.DISPATCHING.value, JobState.CANCELLING.value):
                    return
                if job.backend_job_id:
                    return
                pool, request = job.backend, submit_request(job, first_attempt=self._first_attempt(job, recovering))
        backend = self.backends.get(pool or "")
        if backend is None:
            return
        try:
            result = backend.submit(request)
        except BackendUnavailable as exc:
            self._after_outage(job_id, pool, exc)
            self._take_deferred(job_id)  # the retry records (or adopts) the submission afresh
            return
        except (BackendForbidden, Unsupported, BackendError) as exc:
            self._after_rejection(job_id, pool, exc)
            self._take_deferred(job_id)
            return
        if self.settings.debug_pause_after_submit_s:
            time.sleep(self.settings.debug_pause_after_submit_s)  # crash window 2 (tests)
        how = "adopted existing" if result.adopted else "submitted as"
        with transaction(self.sessions) as s:
            recorded = jobs.mark_submitted(s, job_id=job_id, backend_job_id=result.backend_job_id, actor=ACTOR,
                                           reason=f"{how} {pool} job {result.backend_job_id}",
                                           data={"backend_job_id": result.backend_job_id, "adopted": result.adopted})
        if recorded:
            self._apply_deferred(job_id)
            return
        with transaction(self.sessions) as s:
            job = s.get(Job, job_id, with_for_update=True)
            final = False
            job.backend_job_id = result.backend_job_id
            job.next_attempt_at = None
            if job.state == JobState.DISPATCHING.value:
                jobs.set_state(s, job, JobState.QUEUED, actor=ACTOR,
                               reason=f"{how} {pool} job {result.backend_job_id}",
                               data={"backend_job_id": result.backend_job_id, "adopted": result.adopted})
            else:
                jobs.record_event(s, job, actor=ACTOR, kind="submitted",
                                  reason=f"{how} {pool} job {result.backend_job_id}; cancelling it")
                final = JobState(job.state).final
        if job.state != JobState.QUEUED.value and final:
            # Cancelled while the submission was in flight: do not leave it running.
            try:
                backend.cancel(result.backend_job_id)
            except BackendError as exc:
                log.warning("could not cancel %s on %s after a cancel: %s", job_id, pool, exc.message)
        self._apply_deferred(job_id)

    def _apply_deferred(self, job_id: str) -> None:
        """The watch may have seen the job move on while its submission was being recorded."""
        deferred = self._take_deferred(job_id)
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
            if job.state == JobState.DISPATCHING.value:
                ledger.release(s, job=job, actor=ACTOR, reason=f"{pool} unavailable")
                jobs.set_state(s, job, JobState.PENDING, actor=ACTOR,
                               reason=f"{pool} unavailable ({exc.message}); retry in {delay:.0f} s")
                job.backend = None
            else:  # cancelling: the reconciler finishes it once the backend answers
                jobs.record_event(s, job, actor=ACTOR, kind="retry", reason=f"{pool} unavailable: {exc.message}")
            job.next_attempt_at = now + timedelta(seconds=delay)
        self._views_at = 0.0

    def _after_rejection(self, job_id: str, pool: str, exc: BackendError) -> None:
        with transaction(self.sessions) as s:
            job = s.get(Job, job_id, with_for_update=True)
            ledger.release(s, job=job, actor=ACTOR, reason=f"rejected by {pool}")
            target = JobState.CANCELLED if job.state == JobState.CANCELLING.value else JobState.FAILED
            jobs.set_state(s, job, target, actor=ACTOR, reason=f"rejected by {pool}: {exc.message}")
            job.ended_at = self.clock()
            job.next_attempt_at = None

    # --------------------------------------------------------------- recovery

    def recover_round(self) -> list[str]:
        """Re-drive claims whose dispatcher died (lease expired while dispatching)."""
        now = self.clock()
        with transaction(self.sessions) as s:
            stmt = (select(Job).where(Job.state == JobState.DISPATCHING.value, Job.backend_job_id.is_(None),
                                      Job.next_attempt_at <= now).limit(self.settings.dispatch_batch))
            if not self.settings.is_sqlite:
                stmt = stmt.with_for_update(skip_locked=True)
            stale = list(s.scalars(stmt))
            for job in stale:
                job.next_attempt_at = now + timedelta(seconds=self.settings.dispatch_lease_s)
                jobs.record_event(s, job, actor=ACTOR, kind="recovery",
                                  reason="dispatch claim expired; re-driving the submission idempotently")
            ids = [j.id for j in stale]
        self._submit_all(ids, recovering=True)
        return ids

    # ------------------------------------------------------------- reconcile

    # Above this many followed jobs on one backend, one listing of every gateway job beats
    # a status call per job (Slurm: one squeue/REST listing; Kubernetes: three list calls).
    LIST_THRESHOLD = 5

    def reconcile_round(self, *, full: bool = True, only_cancelling: bool = False) -> int:
        """Poll jobs on their backends; returns how many changed.

        Args:
            full: poll every followed job. The control loop passes False: on a backend whose
                watch is open, a job is then polled only once per ``reconcile_resync_s``
                (the safety net), unless it needs an active call (``cancelling``), has no
                backend id yet, or was missing at the last poll (the lost-job count).
            only_cancelling: poll only ``cancelling`` jobs (a cancel woke the loop).
        """
        states = [JobState.CANCELLING.value] if only_cancelling else [st.value for st in FOLLOWED]
        with transaction(self.sessions) as s:
            rows = s.execute(select(Job.id, Job.backend, Job.backend_job_id, Job.state, Job.next_attempt_at).where(
                Job.state.in_(states))).all()
        now = self.clock()
        mono = time.monotonic()
        resync = {pool for pool in self.backends
                  if full or not self.watch_live(pool)
                  or mono - self._resynced_at.get(pool, -math.inf) >= self.settings.reconcile_resync_s}
        if not only_cancelling:
            for pool in resync:
                self._resynced_at[pool] = mono
        by_backend: dict[str, list] = {}
        for row in rows:
            if row.backend_job_id is None and row.next_attempt_at is not None and as_utc(row.next_attempt_at) > now:
                continue  # a dispatcher holds the claim and its submission may be in flight
            if (row.backend not in resync and row.state != JobState.CANCELLING.value
                    and row.backend_job_id is not None and row.id not in self._misses):
                continue  # its backend's watch follows it; the next resync double-checks
            by_backend.setdefault(row.backend or "", []).append(row)
        changed = 0
        for pool, jobs_here in by_backend.items():
            backend = self.backends.get(pool)
            if backend is None:
                continue
            listed = self._list_statuses(backend) if len(jobs_here) > self.LIST_THRESHOLD else {}
            for job_id, _pool, backend_job_id, state, _lease in jobs_here:
                try:
                    if state == JobState.CANCELLING.value:
                        status = self._cancel_on_backend(backend, job_id, backend_job_id)
                    elif backend_job_id is None:  # adopt only what the adapter proves is ours
                        status = self._find_submitted(backend, job_id)
                    elif backend_job_id in listed:
                        status = listed[backend_job_id]
                    else:  # not in the listing: ask directly (finished, purged or never listed)
                        status = backend.status(backend_job_id)
                except JobNotFound:
                    status = None
                except BackendError as exc:
                    log.warning("reconcile %s on %s: %s", job_id, pool, exc.message)
                    continue
                changed += self.apply_status(job_id, status)
        return changed

    def accrue_round(self) -> int:
        """Charge running gangs' usage so far, once per ``usage_accrual_interval_s`` each.

        Fair share and usage reports then see long jobs while they run (docs/ledger.md).
        Returns how many jobs were charged.
        """
        interval = self.settings.usage_accrual_interval_s
        if not interval:
            return 0
        now = self.clock()
        due = now - timedelta(seconds=interval)
        with transaction(self.sessions) as s:
            ids = list(s.scalars(select(Reservation.job_id).where(
                Reservation.status == "started",
                func.coalesce(Reservation.accrued_at, Reservation.started_at) <= due)))
        charged = 0
        for job_id in ids:
            try:
                with transaction(self.sessions) as s:
                    job = s.get(Job, job_id, with_for_update=True)
                    if job is None or job.state != JobState.RUNNING.value:
                        continue
                    charged += bool(ledger.accrue_usage(s, job=job, now=now, actor=RECONCILER))
            except ledger.ChainChanged:
                continue  # the account tree moved meanwhile: the next round charges it
        return charged

    def _list_statuses(self, backend: Backend) -> dict[str, JobStatus]:
        """``backend_job_id -> status`` of every listed gateway job.

        Keyed by the backend's own id, never by the gateway id the job carries: anyone who
        can submit can write ``isthmus:<id>`` into a Slurm comment (docs/dispatch.md, "Job
        identity").
        """
        try:
            return {st.backend_job_id: st for st in backend.list_gateway_jobs() if st.backend_job_id}
        except BackendError:  # Unsupported or a failed listing: fall back to one call per job
            return {}

    def _find_submitted(self, backend: Backend, job_id: str) -> JobStatus | None:
        """The backend job the gateway submitted for ``job_id`` (mapped user, pool, submit window)."""
        with transaction(self.sessions) as s:
            job = s.get(Job, job_id)
            request = submit_request(job) if job is not None else None
        if request is None:
            return None
        return backend.find_by_gateway_id(job_id, request=request)

    def _cancel_on_backend(self, backend: Backend, job_id: str, backend_job_id: str | None) -> JobStatus | None:
        if backend_job_id is None:
            found = self._find_submitted(backend, job_id)
            if found is None:
                return None
            backend_job_id = found.backend_job_id
        backend.cancel(backend_job_id)
        return backend.status(backend_job_id)

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
                if job.state == JobState.CANCELLING.value:
                    return self._finish(s, job, JobState.CANCELLED, "cancelled (no job left on the backend)",
                                        None, now, None)
                if job.state == JobState.DISPATCHING.value:
                    return 0
                if not self._missing_long_enough(job.id):
                    return 0  # one miss is not a loss (backend restarting, a stale listing)
                return self._finish(s, job, JobState.FAILED, f"job disappeared from {job.backend}", None, now,
                                    job.started_at)
            if job.backend_job_id and status.backend_job_id != job.backend_job_id:
                # Not the submission the registry recorded (e.g. a job someone else submitted
                # with this gateway id in its comment): it says nothing about this job.
                log.warning("ignoring %s job %s: job %s is recorded as %s job %s", job.backend,
                            status.backend_job_id, job.id, job.backend, job.backend_job_id)
                return 0
            self._misses.pop(job.id, None)
            if status.backend_job_id and not job.backend_job_id:
                # Only statuses the adapter matched to our submission get here (find_by_gateway_id
                # with the job's request); the watch defers jobs without a recorded id.
                job.backend_job_id = status.backend_job_id
            if status.nodes:
                job.nodes = list(status.nodes)
            target = BACKEND_TO_JOB[status.state]
            reason = status.reason or status.raw_state or target.value
            if job.state == JobState.CANCELLING.value and not target.final:
                return 0  # still waiting for the backend to confirm the cancel
            at = requeued_at(state=JobState(job.state), started_at=as_utc(job.started_at), status=status, now=now)
            if at is not None:
                # Requeued or preempted on the backend (docs/dispatch.md, "Requeues").
                seen = reason if target in (JobState.QUEUED, JobState.REQUEUED) else \
                    f"requeued at {at.isoformat()} and {target.value} again before the gateway looked"
                changed = self._requeue(s, job, status, seen, at, now, via)
                if job.state != JobState.REQUEUED.value or target in (JobState.QUEUED, JobState.REQUEUED):
                    return changed
                # ... and running again (or ended) already: record that run below.
            if target in (JobState.RUNNING,) and job.started_at is None:
                job.started_at = self._run_start(s, job, as_utc(status.started_at) or now)
                ledger.record_start(s, job=job, started_at=job.started_at, actor=RECONCILER)
            if target.final:
                started = job.started_at or self._run_start(s, job, as_utc(status.started_at), final=True)
                ended = as_utc(status.ended_at) or now
                if started and job.started_at is None:
                    job.started_at = started
                return self._finish(s, job, target, reason, status.exit_code, ended, started, status, via=via)
            if job.state != target.value and not can_transition(JobState(job.state), target):
                # e.g. running -> starting when one worker finishes before its peers: the gang
                # has run; keep the state and only note the backend's words.
                target = JobState(job.state)
            if job.state == target.value:
                if reason != job.state_reason:
                    jobs.record_event(s, job, actor=RECONCILER, kind="backend", reason=reason,
                                      data={"raw_state": status.raw_state, "via": via})
                    job.state_reason = reason
                    return 1
                return 0
            jobs.set_state(s, job, target, actor=RECONCILER, reason=reason,
                           data={"raw_state": status.raw_state, "nodes": list(status.nodes),
                                 "allocated_gpus": status.allocated_gpus, "via": via})
            return 1

    def _requeue(self, s: Session, job: Job, status: JobStatus, reason: str, at: datetime, now: datetime,
                 via: str) -> int:
        """A running gang was taken down at ``at`` and queued again: charge what it ran, re-admit it.

        Its next run is admitted again against the account's GPU-hour budgets; a job that no
        longer fits is cancelled (on the backend too) with the budget's words as the reason.
        """
        started = as_utc(job.started_at) or at
        outcome = ledger.requeue(s, job=job, started_at=started, requeued_at=at, actor=RECONCILER, now=now)
        ran_s = int((at - started).total_seconds())
        job.started_at = None  # the next RUNNING records the new start
        jobs.set_state(s, job, JobState.REQUEUED, actor=RECONCILER,
                       reason=f"requeued by {job.backend} after running {ran_s} s: {reason}",
                       data={"raw_state": status.raw_state, "ran_s": ran_s,
                             "charged_gpu_seconds": outcome.charged_gpu_seconds, "requeued_at": at.isoformat(),
                             "via": via})
        if outcome.over_budget:
            jobs.set_state(s, job, JobState.CANCELLING, actor=RECONCILER,
                           reason=f"cancelled at requeue: over budget: {outcome.over_budget}",
                           data={"over_budget": outcome.over_budget, "via": via})
            self._reconcile_wake.set()  # the polling thread cancels it on the backend now
        return 1

    def _run_start(self, s: Session, job: Job, started: datetime | None, *, final: bool = False) -> datetime | None:
        """The start of the current run: never before the job's last requeue.

        A backend may still report the first run's start after a requeue. For a running job
        the run began at the requeue at the earliest; for a job that ended, an older start
        means it never ran again.
        """
        if started is None:
            return None
        requeued_at = ledger.last_requeue_at(s, job_id=job.id)
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
        job.exit_code = exit_code
        job.ended_at = ended
        if started is not None:
            # A short job can start and end between two rounds: record its start too.
            ledger.record_start(s, job=job, started_at=started, actor=RECONCILER)
            ledger.record_finish(s, job=job, started_at=started, ended_at=ended, actor=RECONCILER)
        elif ledger.last_requeue_at(s, job_id=job.id) is not None:
            # Ended while requeued: its earlier runs were charged; close the reservation as
            # finished (not released) so that usage stays on record and refundable.
            ledger.record_finish(s, job=job, started_at=None, ended_at=ended, actor=RECONCILER)
        else:
            ledger.release(s, job=job, actor=RECONCILER, reason=f"ended without starting: {reason}")
        data = {"exit_code": exit_code, "via": via}
        if status is not None:
            data.update(raw_state=status.raw_state, nodes=list(status.nodes))
        jobs.set_state(s, job, target, actor=RECONCILER, reason=reason, data=data)
        return 1

    # ------------------------------------------------------------ orphans

    def orphans(self) -> list[dict]:
        """Backend jobs carrying a gateway id the registry does not know, or that are not the
        backend job it recorded for that id (e.g. someone else's job with a copied comment)."""
        out: list[dict] = []
        for name, backend in self.backends.items():
            try:
                listed = list(backend.list_gateway_jobs())
            except BackendError as exc:
                out.append({"backend": name, "error": exc.message})
                continue
            ids = [st.gateway_job_id for st in listed if st.gateway_job_id]
            with transaction(self.sessions) as s:
                known = dict(s.execute(select(Job.id, Job.backend_job_id).where(Job.id.in_(ids))).all()) \
                    if ids else {}
            for st in listed:
                if not st.gateway_job_id:
                    continue
                recorded = known.get(st.gateway_job_id, "")
                if st.gateway_job_id not in known or (recorded and recorded != st.backend_job_id):
                    out.append({"backend": name, "backend_job_id": st.backend_job_id,
                                "gateway_job_id": st.gateway_job_id, "state": st.state.value})
        return out

    # ---------------------------------------------------------------- watch

    def apply_event(self, pool: str, status: JobStatus) -> int:
        """Apply one status from ``pool``'s change feed to the registry job it names.

        Statuses of jobs the registry does not know, of final jobs and of jobs routed
        elsewhere are ignored. A job whose submission the dispatcher has not recorded yet
        keeps its latest status aside; :meth:`submit_claimed` applies it once recorded.
        """
        job_id = status.gateway_job_id
        if not job_id:
            return 0
        row = self._followed(job_id)
        if row is None or row.backend != pool:
            return 0
        if row.backend_job_id and status.backend_job_id and row.backend_job_id != status.backend_job_id:
            return 0  # not the submission the registry recorded
        if row.state == JobState.DISPATCHING.value or row.backend_job_id is None:
            with self._deferred_lock:
                self._deferred[job_id] = status
            # The dispatcher may have recorded the submission (and found nothing aside)
            # between our read and now: then it is ours to apply.
            row = self._followed(job_id)
            if row is not None and row.state != JobState.DISPATCHING.value and row.backend_job_id:
                status = self._take_deferred(job_id)
                return self.apply_status(job_id, status, via="watch") if status else 0
            return 0
        return self.apply_status(job_id, status, via="watch")

    def _followed(self, job_id: str):
        with transaction(self.sessions) as s:
            row = s.execute(select(Job.state, Job.backend, Job.backend_job_id).where(Job.id == job_id)).first()
        return None if row is None or JobState(row.state).final else row

    def _take_deferred(self, job_id: str) -> JobStatus | None:
        with self._deferred_lock:
            return self._deferred.pop(job_id, None)

    WATCH_BACKOFF_MAX_S = 30.0

    def watch_backend(self, pool: str) -> None:
        """Follow ``pool``'s change feed until the dispatcher stops (one thread per backend).

        A feed that fails or ends is reopened after a backoff from where it stopped; while
        it is closed, :meth:`reconcile_round` polls the backend's jobs at the normal
        interval, so nothing waits for the resync. A status that cannot be recorded
        (database down) is retried until it is: the feed buffers what comes meanwhile.
        """
        backend = self.backends[pool]
        since: str | None = None
        backoff = 0.5
        while not self._stop.is_set():
            stop = threading.Event()
            self._watch_stops.add(stop)
            if self._stop.is_set():
                stop.set()
            opened = False
            try:
                stream = backend.watch_events(stop, since_resource_version=since,
                                              interested=self._follows(pool))
                self._feeds[pool] = (stream, since is not None)
                for status in stream:
                    if self._stop.is_set():
                        break
                    opened = opened or self.watch_live(pool)
                    self._apply_retrying(pool, status)
                    since = getattr(stream, "resource_version", None) or since
                    backoff = 0.5
                opened = opened or self.watch_live(pool)
            except Exception as exc:  # noqa: BLE001 - the feed must come back whatever broke it
                log.warning("watch on %s failed (%s: %s); reopening in %.1f s", pool, type(exc).__name__,
                            getattr(exc, "message", exc), backoff)
            finally:
                opened = opened or self.watch_live(pool)
                self._feeds.pop(pool, None)
                stop.set()
                self._watch_stops.discard(stop)
            if opened and not self._stop.is_set():
                # Until the feed is back, the poll covers this backend at the normal
                # interval; one full poll now catches what the broken feed may have
                # dropped, and the reopened feed resumes from where it stopped.
                self._resynced_at.pop(pool, None)
                self._poll_due = 0.0
                self._reconcile_wake.set()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.WATCH_BACKOFF_MAX_S)

    def _follows(self, pool: str) -> Callable[[str], bool]:
        """``backend_job_id -> bool``: is this a job the registry still follows on ``pool``?

        Lets a feed's replay skip the backend's retained finished jobs. The set is re-read
        at most once a second, when an id is not in it.
        """
        cache: dict[str, object] = {"ids": frozenset(), "at": -math.inf}

        def follows(backend_job_id: str) -> bool:
            if backend_job_id in cache["ids"]:
                return True
            if time.monotonic() - cache["at"] >= 1.0:
                with transaction(self.sessions) as s:
                    cache["ids"] = frozenset(s.scalars(select(Job.backend_job_id).where(
                        Job.backend == pool, Job.backend_job_id.is_not(None),
                        Job.state.in_([st.value for st in FOLLOWED]))))
                cache["at"] = time.monotonic()
            return backend_job_id in cache["ids"]

        return follows

    def _apply_retrying(self, pool: str, status: JobStatus) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self.apply_event(pool, status)
                return
            except Exception:  # noqa: BLE001 - database restarts and bugs alike
                log.exception("could not record a %s event for job %s; retrying", pool, status.gateway_job_id)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def watch_live(self, pool: str) -> bool:
        """Whether ``pool``'s change feed is open and caught up (the poll then only resyncs it).

        A fresh feed first replays what exists (Kubernetes: every retained gateway Job,
        which takes seconds to minutes); a feed that says so (``caught_up``) counts once it
        is done, and until then the poll keeps following the backend. A resumed feed
        counts at once.
        """
        feed = self._feeds.get(pool)
        if feed is None:
            return False
        stream, resumed = feed
        return resumed or bool(getattr(stream, "caught_up", True))

    # ---------------------------------------------------------------- loop

    def run_once(self) -> None:
        self.recover_round()
        self.dispatch_round()
        self.reconcile_round()

    def _loop(self, rounds: Callable[[], None], wake: threading.Event | None) -> None:
        while not self._stop.is_set():
            if wake is not None:
                wake.clear()
            try:
                rounds()
            except Exception:  # noqa: BLE001 - the loop must survive DB restarts and bugs alike
                log.exception("dispatch loop iteration failed; retrying")
                self._stop.wait(min(5.0, self.settings.dispatch_interval_s * 5))
                continue
            (wake or self._stop).wait(self.settings.dispatch_interval_s)

    def _dispatch_rounds(self) -> None:
        self.recover_round()
        self.dispatch_round()

    def wake(self) -> None:
        """Start the next round now (a job was submitted or cancelled in this process)."""
        self._wake.set()
        self._reconcile_wake.set()  # a cancel needs its active call on the backend

    def _reconcile_loop(self) -> None:
        """Poll every ``dispatch_interval_s``; when woken sooner, only cancelling jobs."""
        while not self._stop.is_set():
            self._reconcile_wake.clear()
            try:
                if time.monotonic() >= self._poll_due:
                    self._poll_due = time.monotonic() + self.settings.dispatch_interval_s
                    self.reconcile_round(full=False)
                    if time.monotonic() >= self._accrue_due:
                        # Its query scans the running reservations: a tenth of the accrual
                        # interval between rounds is plenty, and keeps it off the 1 s poll.
                        self._accrue_due = time.monotonic() + self.settings.usage_accrual_interval_s / 10
                        self.accrue_round()
                else:
                    self.reconcile_round(full=False, only_cancelling=True)
            except Exception:  # noqa: BLE001 - the loop must survive DB restarts and bugs alike
                log.exception("reconcile round failed; retrying")
                self._stop.wait(min(5.0, self.settings.dispatch_interval_s * 5))
                continue
            self._reconcile_wake.wait(max(0.0, self._poll_due - time.monotonic()))

    def run_forever(self) -> None:
        """Dispatch (woken by submissions), reconcile (polling) and one watch per backend with a
        change feed, each in its own thread, until stopped.

        Separate threads keep a new job's dispatch from waiting behind the status calls of
        every running job, and a slow backend's feed from delaying another's.
        """
        threads = [threading.Thread(target=self._reconcile_loop, name="isthmus-reconciler", daemon=True)]
        threads += [threading.Thread(target=self.watch_backend, args=(pool,), name=f"isthmus-watch-{pool}",
                                     daemon=True) for pool in self.watched]
        for t in threads:
            t.start()
        try:
            self._loop(self._dispatch_rounds, self._wake)
        finally:
            self._stop.set()
            self._stop_watches()
            for t in threads:
                t.join(10)

    def _stop_watches(self) -> None:
        for stop in list(self._watch_stops):
            stop.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="isthmus-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10) -> None:
        self._stop.set()
        self._wake.set()
        self._reconcile_wake.set()
        self._stop_watches()
        if self._thread:
            self._thread.join(timeout_s)
