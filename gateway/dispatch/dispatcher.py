"""The dispatcher: the state its threads share, and the loop assembled from its parts.

Each part is one module (docs/dispatch.md): capacity snapshots (capacity.py), the claim
(claim.py), submission (submit.py), recovery (recovery.py), reconciliation by polling
(reconcile.py), change feeds (feeds.py) and the threads that run them (threads.py). What a
backend status means for a job is a pure function (status.py).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from adapters.base import Backend, Feature, JobStatus
from gateway.dispatch.capacity import CapacityMixin
from gateway.dispatch.claim import ClaimMixin
from gateway.dispatch.feeds import FeedsMixin
from gateway.dispatch.reconcile import ReconcileMixin
from gateway.dispatch.recovery import RecoveryMixin
from gateway.dispatch.submit import SubmitMixin
from gateway.dispatch.threads import ThreadsMixin
from gateway.kit.settings import Settings
from gateway.kit.timeutil import utcnow
from gateway.routing.service import PoolView, parse_weights


class Dispatcher(CapacityMixin, ClaimMixin, SubmitMixin, RecoveryMixin, ReconcileMixin, FeedsMixin, ThreadsMixin):
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
        # Gangs this process saw end lately, (pool, workers, GPUs held, monotonic time): a
        # snapshot may still count their units as used for some seconds (planning.lagging_ends).
        self.recent_ends: collections.deque[tuple[str, int, int, float]] = collections.deque(maxlen=4096)
