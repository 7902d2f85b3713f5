"""Pool health: one probe per pool, from the same capacity snapshot routing uses.

A pool is healthy when its backend answers with the configured partition / ClusterQueue
and that has GPUs. Anything else (unreachable, bad credentials, unknown partition or
ClusterQueue, no GPUs) is unhealthy with the backend's own words, and routing never sees
it as idle (a snapshot without capacity never fits now).
"""

from __future__ import annotations

import dataclasses

from adapters.base import Backend
from gateway.routing.service import PoolView


@dataclasses.dataclass(frozen=True)
class PoolHealth:
    name: str
    kind: str
    ok: bool
    reason: str
    view: PoolView


def health_of(view: PoolView) -> PoolHealth:
    kind = view.backend.name if view.backend is not None else view.name
    if view.capacity is None:
        return PoolHealth(view.name, kind, False, view.error or "no answer from the backend", view)
    if view.total_gpus <= 0:
        where = ", ".join(p.pool for p in view.capacity.pools) or view.name
        return PoolHealth(view.name, kind, False, f"{where} has no GPUs: no job can run there", view)
    return PoolHealth(view.name, kind, True, view.describe().split(": ", 1)[-1], view)


def probe(name: str, backend: Backend) -> PoolHealth:
    """Ask the backend now (start-up; tests)."""
    return health_of(PoolView.snapshot(name, backend))


def current(dispatcher) -> dict[str, PoolHealth]:
    """Every configured pool's health from the dispatcher's latest snapshot (refreshed
    when older than ``capacity_ttl_s``)."""
    if dispatcher is None:
        return {}
    return {name: health_of(view) for name, view in sorted(dispatcher.views().items())}
