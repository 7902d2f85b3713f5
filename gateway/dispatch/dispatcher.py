"""The dispatcher: its parts, wired together, and the threads that run them.

Each part is one object with the collaborators it needs passed in (docs/dispatch.md):
capacity snapshots (capacity.py), the claim (claim.py), submission (submit.py), recovery
(recovery.py), reconciliation by polling (reconcile.py) and change feeds (feeds.py). What a
backend status means for a job is a pure function (status.py). The dispatcher owns the
threads: dispatch (woken by submissions), reconcile (polling) and one watch per feed.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from adapters.base import Backend, Feature, JobStatus, features_of
from gateway.dispatch.capacity import Capacity
from gateway.dispatch.claim import Claimer
from gateway.dispatch.common import Launch, log
from gateway.dispatch.faults import NONE, Faults
from gateway.dispatch.feeds import Deferred, OpenFeeds, Watcher
from gateway.dispatch.health import Beats
from gateway.dispatch.holds import NativeReservations
from gateway.dispatch.liveness import Liveness
from gateway.dispatch.nodes import NodeWatch
from gateway.dispatch.preempt import Preemptor
from gateway.dispatch.reconcile import Reconciler
from gateway.dispatch.recovery import Recovery
from gateway.dispatch.submit import Submitter
from gateway.domain.routing import PoolView, parse_weights
from gateway.domain.storage import NO_STORAGE, Catalog
from gateway.jobs.checkpoints import JobCredentials
from gateway.kit.settings import DispatchSettings
from gateway.kit.timeutil import utcnow


class Dispatcher:
    def __init__(self, *, sessions: sessionmaker[Session], backends: dict[str, Backend], settings: DispatchSettings,
                 clock: Callable[[], datetime] = utcnow, faults: Faults = NONE, storage: Catalog = NO_STORAGE):
        self.sessions = sessions
        self.backends = backends
        self._settings = settings
        self.clock = clock
        self._stop = threading.Event()
        self.beats = Beats("dispatch", "reconcile")  # each loop's last pass (health.py)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # Gangs this process saw end lately, (pool, workers, GPUs held, monotonic time): a
        # snapshot may still count their units as used for some seconds (plan_inputs.lagging_ends).
        self.recent_ends: collections.deque[tuple[str, int, int, float]] = collections.deque(maxlen=4096)
        # Backends with a change feed are followed by one watch thread each (docs/dispatch.md).
        self.watched = [name for name, b in backends.items() if features_of(b).has(Feature.WATCH)]
        common = {"sessions": sessions, "backends": backends}
        # This worker's key and lock, and which other workers are gone (Postgres; liveness.py).
        self.liveness = Liveness(sessions.kw.get("bind"), grace_s=settings.dispatch_owner_grace_s)
        self.open_feeds = open_feeds = OpenFeeds()
        deferred = Deferred()
        self.capacity = Capacity(**common, settings=settings, storage=storage,
                                 withheld=lambda pool: self.node_watch.withheld(pool))
        # What every submitted job gets besides its spec (common.Launch): storages, the
        # preemption grace period, its checkpoint credential and the gateway's URL.
        self.credentials = JobCredentials(sessions)
        try:  # read (or make) its key now, not inside the first round; else at the first round
            self.credentials.prime()
        except SQLAlchemyError as exc:
            log.info("job credential key not read yet (%s); the first dispatch round reads it", type(exc).__name__)
        # Node health: the nodes each gang avoids, drains of suspect nodes (nodes.py).
        self.node_watch = NodeWatch(**common, settings=settings, clock=clock,
                                    views=lambda: self.capacity.latest_views())
        self.launch = Launch(storage=storage, preempt_grace_s=settings.preempt_grace_s,
                             job_api_url=settings.job_api_url, credentials=self.credentials, nodes=self.node_watch)
        self.reconciler = Reconciler(**common, settings=settings, clock=clock, stop=self._stop, open_feeds=open_feeds,
                                     recent_ends=self.recent_ends, beat=lambda: self.beats.beat("reconcile"),
                                     liveness=self.liveness)
        self.watcher = Watcher(**common, stop=self._stop, open_feeds=open_feeds, deferred=deferred,
                               reconciler=self.reconciler)
        self.submitter = Submitter(**common, settings=settings, clock=clock, capacity=self.capacity,
                                   deferred=deferred, apply_status=self.reconciler.apply_status, launch=self.launch,
                                   faults=faults)
        self.claimer = Claimer(**common, settings=settings, clock=clock, capacity=self.capacity,
                               submitter=self.submitter, recent_ends=self.recent_ends,
                               weights=parse_weights(settings.routing_weights), launch=self.launch, faults=faults,
                               liveness=self.liveness)
        self.preemptor = Preemptor(**common, settings=settings, clock=clock)
        self.recovery = Recovery(sessions=sessions, settings=settings, clock=clock, submitter=self.submitter,
                                 liveness=self.liveness)
        self.native_reservations = NativeReservations(**common, views=self.capacity.views, clock=clock)

    @property
    def settings(self) -> DispatchSettings:
        return self._settings

    @settings.setter
    def settings(self, value: DispatchSettings) -> None:
        """New settings for every part at once (tests and benchmarks change them between rounds)."""
        self._settings = value
        for part in (self.capacity, self.reconciler, self.submitter, self.claimer, self.recovery, self.node_watch):
            part.settings = value
        self.liveness.grace_s = value.dispatch_owner_grace_s

    # --- the rounds (tests and `isthmus worker --once` drive them one at a time) ---------

    def views(self, *, fresh: bool = False) -> dict[str, PoolView]:
        return self.capacity.views(fresh=fresh)

    def latest_views(self) -> dict[str, PoolView]:
        return self.capacity.latest_views()

    def recover_round(self) -> list[str]:
        return self.recovery.recover_round()

    def dispatch_round(self) -> list[str]:
        return self.claimer.dispatch_round()

    def nodes_round(self, *, force: bool = False) -> int:
        """Node health: the rule applied, suspect nodes drained where allowed (nodes.py)."""
        return self.node_watch.refresh(force=force)

    def reconcile_round(self, *, full: bool = True, only_cancelling: bool = False) -> int:
        return self.reconciler.reconcile_round(full=full, only_cancelling=only_cancelling)

    def accrue_round(self) -> int:
        return self.reconciler.accrue_round()

    def apply_event(self, pool: str, status: JobStatus) -> int:
        return self.watcher.apply_event(pool, status)

    def watch_live(self, pool: str) -> bool:
        return self.open_feeds.live(pool)

    def orphans(self) -> list[dict]:
        return self.reconciler.orphans()

    def preempt_round(self) -> int:
        return self.preemptor.preempt_round()

    def sync_reservations(self) -> int:
        """Make the backends' own reservations match the registry's advance reservations (holds.py)."""
        return self.native_reservations.sync()

    def run_once(self) -> None:
        self.recover_round()
        self.sync_reservations()
        self.nodes_round()
        self.dispatch_round()
        self.preempt_round()
        self.capacity.store_limits()
        self.reconcile_round()

    # --- the threads ---------------------------------------------------------------------

    def wake(self) -> None:
        """Start the next round now (a job was submitted or cancelled in this process)."""
        self._wake.set()
        self.reconciler.wake()  # a cancel needs its active call on the backend

    def _dispatch_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            self.beats.beat("dispatch")
            try:
                self.recover_round()
                if self.native_reservations.due():
                    self.sync_reservations()
                self.nodes_round()
                self.dispatch_round()
                self.preempt_round()
                self.capacity.store_limits()
            except Exception:  # noqa: BLE001 - the loop must survive DB restarts and bugs alike
                log.exception("dispatch loop iteration failed; retrying")
                self._stop.wait(min(5.0, self.settings.dispatch_interval_s * 5))
                continue
            self._wake.wait(self.settings.dispatch_interval_s)

    def run_forever(self) -> None:
        """Dispatch (woken by submissions), reconcile (polling) and one watch per backend with a
        change feed, each in its own thread, until stopped.

        Separate threads keep a new job's dispatch from waiting behind the status calls of
        every running job, and a slow backend's feed from delaying another's.
        """
        self.liveness.start()  # its claims carry its key from the first round on
        threads = [threading.Thread(target=self.reconciler.loop, name="isthmus-reconciler", daemon=True)]
        threads += [threading.Thread(target=self.watcher.watch_backend, args=(pool,), name=f"isthmus-watch-{pool}",
                                     daemon=True) for pool in self.watched]
        for t in threads:
            t.start()
        try:
            self._dispatch_loop()
        finally:
            self._stop.set()
            self.watcher.stop_watches()
            for t in threads:
                t.join(10)
            self.liveness.stop()

    def request_stop(self) -> None:
        """Ask the threads to end (a signal handler: no waiting here)."""
        self._stop.set()
        self._wake.set()
        self.reconciler.wake()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="isthmus-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10) -> None:
        self._stop.set()
        self._wake.set()
        self.reconciler.wake()
        self.watcher.stop_watches()
        if self._thread:
            self._thread.join(timeout_s)
        self.reconciler.stop_output_keeper()
