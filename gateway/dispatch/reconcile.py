"""Reconciliation (polling): follow jobs on their backends and hand what they say to ``Outcomes``.

Which jobs to ask, and how (one listing or one call each, the active cancel, the search for
a submission whose id was never recorded) is this module's; what a status does to the job and
the ledger is ``outcomes.py``'s, shared with the change feeds (feeds.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import func, select

from adapters.base import (
    Backend,
    BackendError,
    Feature,
    JobNotFound,
    JobStatus,
    features_of,
)
from gateway.dispatch import orphans as orphan_listing
from gateway.dispatch.common import FOLLOWED, RECONCILER, log, submit_request
from gateway.dispatch.keeper import OutputKeeper
from gateway.dispatch.liveness import Liveness
from gateway.dispatch.outcomes import Outcomes
from gateway.domain.states import JobState
from gateway.kit.db import transaction
from gateway.kit.timeutil import as_utc
from gateway.ledger import chains as ledger_chains
from gateway.ledger.decayed import Ledger
from gateway.models.jobs import Job
from gateway.models.ledger import Reservation


class Reconciler:
    """Follows jobs on their backends by polling, hands what they say to ``Outcomes`` (which
    records it and charges the ledger), and runs the polling loop of its own thread."""

    # Above this many followed jobs on one backend, one listing of every gateway job beats
    # a status call per job (Slurm: one squeue/REST listing; Kubernetes: three list calls).
    LIST_THRESHOLD = 5

    def __init__(self, *, sessions, backends: dict, settings, clock, stop: threading.Event, open_feeds,
                 recent_ends, liveness: Liveness, beat: Callable[[], None] = lambda: None) -> None:
        self.sessions = sessions
        self.liveness = liveness  # whose claims are dead (a cancel behind them is carried out now)
        self._beat = beat  # notes each pass of loop() (dispatch/health.py)
        self.backends = backends
        self._settings = settings
        self.clock = clock
        self._stop = stop  # the dispatcher's: set when it stops
        self.open_feeds = open_feeds  # feeds.OpenFeeds: which pools a live change feed follows
        self._wake = threading.Event()
        self.output = OutputKeeper(sessions=sessions, settings=settings)
        self.outcomes = Outcomes(sessions=sessions, backends=backends, settings=settings, clock=clock,
                                 output=self.output, recent_ends=recent_ends,  # Outcomes._finish appends
                                 wake=self._wake.set)
        self._resynced_at: dict[str, float] = {}  # pool -> monotonic time of its last full poll
        self._poll_due = 0.0  # monotonic time of the next polling round
        self._accrue_due = 0.0  # ... and of the next usage-accrual round

    @property
    def settings(self):
        return self._settings

    @settings.setter
    def settings(self, value) -> None:
        """New settings for the polling, the outcomes and the output keeper at once (the
        dispatcher's ``settings`` setter hands every part new ones between rounds)."""
        self._settings = self.outcomes.settings = self.output.settings = value

    def wake(self) -> None:
        """Poll now: a cancel needs its active call on the backend."""
        self._wake.set()

    def resync(self, pool: str) -> None:
        """Poll ``pool`` in full now and at the normal interval until its feed is back."""
        self._resynced_at.pop(pool, None)
        self._poll_due = 0.0
        self._wake.set()

    def loop(self) -> None:
        """Poll every ``dispatch_interval_s``; when woken sooner, only cancelling jobs."""
        while not self._stop.is_set():
            self._wake.clear()
            self._beat()
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
            self._wake.wait(max(0.0, self._poll_due - time.monotonic()))

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
            rows = s.execute(select(Job.id, Job.pool, Job.backend_job_id, Job.state, Job.next_attempt_at,
                                    Job.claim_owner).where(Job.state.in_(states))).all()
            # A cancel accepted while its claim's worker is dead is carried out now, not when
            # the lease ends (issue #47, item 6): that worker will never submit or cancel it.
            # Their owners are in the rows just read (no owner, no look at pg_locks).
            dead = self.liveness.dead(s.connection(), {
                row.claim_owner for row in rows
                if row.state == JobState.CANCELLING.value and row.backend_job_id is None})
        now = self.clock()
        mono = time.monotonic()
        resync = {pool for pool in self.backends
                  if full or not self.open_feeds.live(pool)
                  or mono - self._resynced_at.get(pool, -math.inf) >= self.settings.reconcile_resync_s}
        if not only_cancelling:
            for pool in resync:
                self._resynced_at[pool] = mono
        by_pool: dict[str, list] = {}
        for row in rows:
            if (row.backend_job_id is None and row.next_attempt_at is not None and as_utc(row.next_attempt_at) > now
                    and row.claim_owner not in dead):
                continue  # a live dispatcher holds the claim and its submission may be in flight
            if (row.pool not in resync and row.state != JobState.CANCELLING.value
                    and row.backend_job_id is not None and not self.outcomes.missing(row.id)):
                continue  # its backend's watch follows it; the next resync double-checks
            by_pool.setdefault(row.pool or "", []).append(row)
        changed = 0
        for pool, jobs_here in by_pool.items():
            backend = self.backends.get(pool)
            if backend is None:
                continue
            listed = self._list_statuses(backend) if len(jobs_here) > self.LIST_THRESHOLD else {}
            for job_id, _pool, backend_job_id, state, _lease, _owner in jobs_here:
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
                    charged += bool(Ledger.of(self.settings).accrue_usage(s, job=job, now=now, actor=RECONCILER))
            except ledger_chains.ChainChanged:
                continue  # the account tree moved meanwhile: the next round charges it
        return charged

    def _list_statuses(self, backend: Backend) -> dict[str, JobStatus]:
        """``backend_job_id -> status`` of every listed gateway job.

        Keyed by the backend's own id, never by the gateway id the job carries: anyone who
        can submit can write ``isthmus:<id>`` into a Slurm comment (docs/dispatch.md, "Job
        identity").
        """
        if not features_of(backend).has(Feature.LISTING):
            return {}  # one call per job
        try:
            return {st.backend_job_id: st for st in backend.list_gateway_jobs() if st.backend_job_id}
        except BackendError:  # a failed listing: fall back to one call per job
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
        self.output.keep_before_cancel(backend, job_id, backend_job_id)
        backend.cancel(backend_job_id)
        return backend.status(backend_job_id)

    def apply_status(self, job_id: str, status: JobStatus | None, *, via: str = "poll") -> int:
        """Record what the backend says about one job (``Outcomes.apply_status``)."""
        return self.outcomes.apply_status(job_id, status, via=via)

    def stop_output_keeper(self) -> None:
        """Take no more copies of output; those under way finish."""
        self.output.stop()

    def orphans(self) -> list[dict]:
        """Backend jobs carrying a gateway id the registry does not back (``orphans.orphans``)."""
        return orphan_listing.orphans(self.sessions, self.backends)
