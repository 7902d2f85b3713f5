"""Capacity snapshots: what each pool has free now, cached for ``capacity_ttl_s``."""

from __future__ import annotations

import time

from gateway.jobs.states import JobState
from gateway.kit.db import transaction
from gateway.pools.service import pool_meta
from gateway.routing.service import PoolView


class CapacityMixin:
    def views(self, *, fresh: bool = False) -> dict[str, PoolView]:
        if fresh or time.monotonic() - self._views_at > self.settings.capacity_ttl_s or not self._views:
            with transaction(self.sessions) as s:  # each pool's row and its jobs dispatching or queued
                meta, depth = pool_meta(s, queued_states=(JobState.DISPATCHING.value, JobState.QUEUED.value))
            self._views = {name: PoolView.snapshot(name, b, depth.get(name, 0), meta.get(name))
                           for name, b in self.backends.items()}
            self._views_at = time.monotonic()
        return self._views

    def latest_views(self) -> dict[str, PoolView]:
        """The last capacity snapshot as it is (maybe stale, maybe empty); never asks a pool.

        For the submit path, which must not wait on a cluster.
        """
        return dict(self._views)
