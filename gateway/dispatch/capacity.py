"""Capacity snapshots: what each pool has free now, cached for ``capacity_ttl_s``."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.domain.routing import PoolView
from gateway.domain.states import JobState
from gateway.domain.storage import NO_STORAGE, Catalog
from gateway.kit.db import transaction
from gateway.kit.timeutil import utcnow
from gateway.pools import service as pools
from gateway.pools.service import LIMITS_REFRESH_S, pool_meta, record_limits


class Capacity:
    """Each pool's capacity snapshot, taken at most every ``capacity_ttl_s`` unless asked fresh."""

    def __init__(self, *, sessions, backends: dict, settings, storage: Catalog = NO_STORAGE,
                 withheld: Callable[[str], int] = lambda pool: 0) -> None:
        self.sessions = sessions
        # Quarantined nodes a pool's backend still offers (dispatch/nodes.py): not the planner's.
        self.withheld = withheld
        self.backends = backends
        self.settings = settings
        # The pools file's storages (docs/storage.md): what each pool provides is part of its view.
        self.storage = storage
        self._views: dict[str, PoolView] = {}
        self._views_at = 0.0
        self._stored: dict[str, tuple[dict, float]] = {}  # pool -> (limits written, monotonic time)

    def invalidate(self) -> None:
        """The next :meth:`views` asks the pools again (a pool just failed a submission)."""
        self._views_at = 0.0

    def views(self, *, fresh: bool = False) -> dict[str, PoolView]:
        if not self.backends:  # no pool to snapshot: no query (every dashboard page asks; issue #46)
            return {}
        if fresh or time.monotonic() - self._views_at > self.settings.capacity_ttl_s or not self._views:
            with transaction(self.sessions) as s:  # each pool's row and its jobs dispatching or queued
                meta, depth = pool_meta(s, queued_states=(JobState.DISPATCHING.value, JobState.QUEUED.value))
            self._views = {name: pools.snapshot(name, b, depth.get(name, 0),
                                                {**meta.get(name, {}), "storages": self.storage.provided_by(name)},
                                                withheld=self.withheld(name))
                           for name, b in self.backends.items()}
            self._views_at = time.monotonic()
        return self._views

    def store_limits(self) -> None:
        """Write each pool's static limits from the last snapshot when they changed, or every
        ``LIMITS_REFRESH_S``, so a process without a dispatcher refuses a job that can never fit
        at submit time too (gateway/jobs/admission.py ``refuse_if_never_fits``). Housekeeping
        after a round (Dispatcher), not part of one: a round's statements stay what they were."""
        now = time.monotonic()
        due = {}
        for name, view in self._views.items():
            limits = view.limits()
            if limits is None:
                continue
            stored = self._stored.get(name)
            if stored is None or stored[0] != limits or now - stored[1] > LIMITS_REFRESH_S:
                due[name] = limits
        if not due:
            return
        with transaction(self.sessions) as s:
            record_limits(s, due, now=utcnow())
        self._stored.update({name: (limits, now) for name, limits in due.items()})

    def latest_views(self) -> dict[str, PoolView]:
        """The last capacity snapshot as it is (maybe stale, maybe empty); never asks a pool.

        For the submit path, which must not wait on a cluster.
        """
        return dict(self._views)
