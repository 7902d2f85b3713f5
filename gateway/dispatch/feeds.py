"""Feeds (watch): one thread per backend with a change feed applies its statuses as they come."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from sqlalchemy import select

from adapters.base import JobStatus
from gateway.dispatch.common import FOLLOWED, log
from gateway.domain.states import JobState
from gateway.kit.db import transaction
from gateway.models.jobs import Job


class OpenFeeds:
    """The change feeds open now, by pool: the watcher writes it, the reconciler reads it."""

    def __init__(self) -> None:
        self._feeds: dict[str, tuple[object, bool]] = {}  # pool -> (open feed, resumed from a position)

    def opened(self, pool: str, stream: object, resumed: bool) -> None:
        self._feeds[pool] = (stream, resumed)

    def closed(self, pool: str) -> None:
        self._feeds.pop(pool, None)

    def live(self, pool: str) -> bool:
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


class Deferred:
    """Watch statuses of jobs whose submission the dispatcher has not recorded yet."""

    def __init__(self) -> None:
        self._statuses: dict[str, JobStatus] = {}
        self._lock = threading.Lock()

    def put(self, job_id: str, status: JobStatus) -> None:
        with self._lock:
            self._statuses[job_id] = status

    def take(self, job_id: str) -> JobStatus | None:
        with self._lock:
            return self._statuses.pop(job_id, None)


class Watcher:
    """One thread per backend with a change feed applies its statuses as they come."""

    def __init__(self, *, sessions, backends: dict, stop: threading.Event, open_feeds: OpenFeeds,
                 deferred: Deferred, reconciler) -> None:
        self.sessions = sessions
        self.backends = backends
        self._stop = stop  # the dispatcher's: set when it stops
        self.open_feeds = open_feeds
        self.deferred = deferred
        self.reconciler = reconciler  # applies statuses; polls a pool whose feed broke
        self._watch_stops: set[threading.Event] = set()

    def stop_watches(self) -> None:
        for stop in list(self._watch_stops):
            stop.set()

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
        if row is None or row.pool != pool:
            return 0
        if row.backend_job_id and status.backend_job_id and row.backend_job_id != status.backend_job_id:
            return 0  # not the submission the registry recorded
        if row.state == JobState.DISPATCHING.value or row.backend_job_id is None:
            self.deferred.put(job_id, status)
            # The dispatcher may have recorded the submission (and found nothing aside)
            # between our read and now: then it is ours to apply.
            row = self._followed(job_id)
            if row is not None and row.state != JobState.DISPATCHING.value and row.backend_job_id:
                status = self.deferred.take(job_id)
                return self.reconciler.apply_status(job_id, status, via="watch") if status else 0
            return 0
        return self.reconciler.apply_status(job_id, status, via="watch")

    def _followed(self, job_id: str):
        with transaction(self.sessions) as s:
            row = s.execute(select(Job.state, Job.pool, Job.backend_job_id).where(Job.id == job_id)).first()
        return None if row is None or JobState(row.state).final else row

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
                self.open_feeds.opened(pool, stream, since is not None)
                for status in stream:
                    if self._stop.is_set():
                        break
                    opened = opened or self.open_feeds.live(pool)
                    self._apply_retrying(pool, status)
                    since = getattr(stream, "resource_version", None) or since
                    backoff = 0.5
                opened = opened or self.open_feeds.live(pool)
            except Exception as exc:  # noqa: BLE001 - the feed must come back whatever broke it
                log.warning("watch on %s failed (%s: %s); reopening in %.1f s", pool, type(exc).__name__,
                            getattr(exc, "message", exc), backoff)
            finally:
                opened = opened or self.open_feeds.live(pool)
                self.open_feeds.closed(pool)
                stop.set()
                self._watch_stops.discard(stop)
            if opened and not self._stop.is_set():
                # Until the feed is back, the poll covers this backend at the normal
                # interval; one full poll now catches what the broken feed may have
                # dropped, and the reopened feed resumes from where it stopped.
                self.reconciler.resync(pool)
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
                        Job.pool == pool, Job.backend_job_id.is_not(None),
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
