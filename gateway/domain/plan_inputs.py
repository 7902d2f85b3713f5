"""The planner's inputs from a round's snapshot, pure: pools in the planner's units, what is
free now, releases for gangs that ended lately, and a job as a candidate.

The registry's side (each gang's expected end) is read by gateway/dispatch/planning.py
(``releases``); docs/dispatch.md, "Reservations and backfill", says how the pieces fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from gateway.domain.planner import Candidate, PoolModel, Release
from gateway.domain.routing import JobShape, PoolView


def pool_models(views: Mapping[str, PoolView]) -> list[PoolModel]:
    """Pools with a capacity snapshot, in the planner's units."""
    out = []
    for name, view in views.items():
        if view.capacity is None:
            continue
        if view.node_exclusive:
            out.append(PoolModel(name, True, view.total_nodes, view.gpus_per_node))
        else:
            out.append(PoolModel(name, False, view.total_gpus, view.gpus_per_node))
    return out


def _free_and_total(view: PoolView) -> tuple[int, int]:
    """The snapshot's free and total units in the pool's unit: whole nodes or GPUs."""
    if view.node_exclusive:
        return view.idle_nodes, view.total_nodes
    return view.free_gpus, view.total_gpus


# How long after a gang ended its units may still show as used in a snapshot (Kueue frees a
# finished workload's quota a little after its pods end; a cached snapshot is older still).
RECENT_END_S = 60.0


def lagging_ends(views: Mapping[str, PoolView], held: Mapping[str, int],
                 recent: Iterable[tuple[str, int, int, float]], *, now: datetime,
                 monotonic_now: float) -> tuple[list[Release], dict[str, int]]:
    """Releases "soon" for the units of gangs that ended lately but the snapshot still counts as used.

    ``recent``: (pool, workers, GPUs held, monotonic time it ended) of the gangs this process
    saw end. Without this, the snapshot's used units that no registry gang explains look like
    someone else's work with no known end, the planner finds no time at which a whole-pool
    gang fits, plans no reservation for it in that round, and a lower job takes the free
    node: exactly what reservations exist to prevent. A pool's lagging units are at most what
    its snapshot uses beyond the registry's gangs (``held``), so a snapshot that already shows
    them free changes nothing. Returns the releases and ``held`` with them added.
    """
    ended: dict[str, int] = {}
    for pool, workers, gpus, at in recent:
        view = views.get(pool)
        if view is None or view.capacity is None or monotonic_now - at > RECENT_END_S:
            continue
        ended[pool] = ended.get(pool, 0) + (workers if view.node_exclusive else gpus)
    soon = now.timestamp() + 1.0
    out: list[Release] = []
    held_now = dict(held)
    for pool, units in ended.items():
        free, total = _free_and_total(views[pool])
        lag = min(units, max(0, total - free - held_now.get(pool, 0)))
        if lag:
            out.append(Release(pool, lag, soon))
            held_now[pool] = held_now.get(pool, 0) + lag
    return out, held_now


def free_now(views: Mapping[str, PoolView], held: Mapping[str, int]) -> dict[str, int]:
    """Units free now: what the snapshot says, capped by total less what the registry's gangs hold.

    The cap covers a job dispatched but not yet in the snapshot; taking the smaller keeps
    free + every release never above the pool's total, and below it only by what others
    (jobs the gateway does not know) hold with no known end.
    """
    out = {}
    for name, view in views.items():
        free, total = _free_and_total(view)
        out[name] = max(0, min(free, total - held.get(name, 0)))
    return out


def candidate(job, pools: tuple[str, ...], blocked: str = "", shape: JobShape | None = None) -> Candidate:
    return Candidate(id=job.id, workers=job.workers, gpus_per_worker=job.gpus_per_worker,
                     time_limit_s=float(job.time_limit_s), pools=pools, blocked=blocked, account=job.account_name,
                     topology=shape.topology if shape is not None and shape.topology_required else "")


def domains(views: Mapping[str, PoolView]) -> dict[str, dict[str, dict[str, int]]]:
    """Room now per topology domain, in the planner's units of each pool that declares any:
    whole idle nodes on a node-exclusive pool, free GPUs on one that places GPUs one by one
    (an upper bound: routing's room() counts whole workers per node before anything starts)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for name, v in views.items():
        if not v.domains or v.capacity is None:
            continue
        if v.node_exclusive:
            out[name] = v.domains
        elif v.domain_gpus:
            out[name] = {level: {d: sum(free) for d, free in per.items()} for level, per in v.domain_gpus.items()}
    return out
