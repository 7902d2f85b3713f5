"""Feeds (watch): one thread per backend with a change feed applies its statuses as they come."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from sqlalchemy import select

from adapters.base import JobStatus
from gateway.dispatch.common import FOLLOWED, log
from gateway.jobs.models import Job
from gateway.jobs.states import JobState
from gateway.kit.db import transaction


class FeedsMixin:
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
