"""Pool health: one probe per pool, from the same capacity snapshot routing uses.

A pool is healthy when its backend answers with the configured partition / ClusterQueue
and that has GPUs. Anything else (unreachable, bad credentials, unknown partition or
ClusterQueue, no GPUs) is unhealthy with the backend's own words, and routing never sees
it as idle (a snapshot without capacity never fits now).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from adapters.base import Backend, BackendError, features_of
from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.domain.routing import PoolView
from gateway.kit import signals


@dataclasses.dataclass(frozen=True)
class PoolHealth:
    name: str
    kind: str
    ok: bool
    reason: str
    view: PoolView


def health_of(view: PoolView) -> PoolHealth:
    kind = view.kind
    if view.capacity is None:
        return PoolHealth(view.name, kind, False, view.error or "no answer from the backend", view)
    if view.total_gpus <= 0:
        where = ", ".join(p.pool for p in view.capacity.pools) or view.name
        return PoolHealth(view.name, kind, False, f"{where} has no GPUs: no job can run there", view)
    return PoolHealth(view.name, kind, True, view.describe().split(": ", 1)[-1], view)


def require_known(session, pool: str, field: str, *, or_auto: bool = False) -> str:
    """``pool`` when the gateway knows it (the ``pool`` table), else Invalid naming ``field``.

    The one unknown-pool check: jobs and job sets naming a pool, per-pool quotas and billing
    weights. A pool known but not configured now is accepted (its jobs wait, as with no pool).
    """
    from sqlalchemy import select

    from gateway.kit.errors import Invalid
    from gateway.models.pools import Pool

    if session.get(Pool, pool) is None:
        known = ", ".join(session.scalars(select(Pool.name).where(Pool.configured.is_(True)).order_by(Pool.name)))
        raise Invalid(field, f"unknown pool {pool!r}; this gateway has: {known or 'no pool yet'} (GET /v1/pools)"
                             + (", or use auto" if or_auto else ""))
    return pool


def snapshot(name: str, backend: Backend, queue_depth: int = 0, meta: Mapping | None = None, *,
             withheld: int = 0) -> PoolView:
    """Ask the pool's adapter for its capacity now, and see it as a round does
    (``PoolView.of_capacity``): the one place a capacity is asked for a view.

    ``withheld``: quarantined nodes the backend still offers (docs/recovery.md, "Node health"):
    taken from the idle ones (which of them is idle is not known here: a conservative count)."""
    try:
        cap, error = backend.capacity(), ""
    except BackendError as exc:
        cap, error = None, exc.message
    if cap is not None and withheld:
        cap = dataclasses.replace(cap, pools=tuple(
            dataclasses.replace(p, idle_nodes=max(0, p.idle_nodes - withheld),
                                free_gpus=max(0, p.free_gpus - withheld * p.gpus_per_node) if p.gpus_per_node
                                else p.free_gpus,
                                detail=p.detail + f"; {withheld} quarantined node(s) withheld")
            for p in cap.pools))
    return PoolView.of_capacity(name, features_of(backend), cap, error=error, queue_depth=queue_depth, meta=meta)


def probe(name: str, backend: Backend) -> PoolHealth:
    """Ask the backend now (start-up; tests)."""
    return health_of(snapshot(name, backend))


def current(dispatcher) -> dict[str, PoolHealth]:
    """Every configured pool's health from the dispatcher's latest snapshot (refreshed
    when older than ``capacity_ttl_s``)."""
    if dispatcher is None:
        return {}
    return {name: health_of(view) for name, view in sorted(dispatcher.views().items())}


# ----------------------------------------------------------------- the pool table

# What a job waits for, and GET /v1/pools says, while no pool is configured.
NO_POOL = ("no pool is configured on this gateway (ISTHMUS_POOLS_FILE or ISTHMUS_BACKENDS); jobs wait in pending "
           "until one is")


ACTIVE_JOB_STATES = ("dispatching", "queued", "starting", "running", "requeued", "cancelling")


def reconcile(session, pools, *, now=None) -> list[str]:
    """Write the configured pools into the ``pool`` table; return notes for the log.

    New pools are added with the file's state and weight; known ones take the file's kind,
    GPU types, cost, and state/weight unless an administrator set them (``*_by``). A pool
    that is no longer configured is kept (history, quotas) as ``configured = false``,
    unless jobs are still active on it: then BackendConfigError names it and the jobs,
    because dropping it would strand them (nobody would follow or cancel them).
    """
    from sqlalchemy import func, select

    from gateway.models.jobs import Job
    from gateway.models.pools import Pool
    from gateway.pools.adapters import BackendConfigError

    rows = {p.name: p for p in session.scalars(select(Pool))}
    configured = {p.name for p in pools}
    vanished = [name for name, row in rows.items() if row.configured and name not in configured]
    if vanished:
        active = dict(session.execute(
            select(Job.pool, func.count()).where(Job.pool.in_(vanished), Job.state.in_(ACTIVE_JOB_STATES))
            .group_by(Job.pool)).all())
        stranded = sorted(active)
        if stranded:
            what = ", ".join(f"pool {n!r} has {active[n]} active job(s)" for n in stranded)
            raise BackendConfigError(f"pools configuration: {what} but is no longer configured; put it back (state: "
                                     "draining lets its jobs finish) or cancel them first")
    notes = []
    before = {name: _shown(row) for name, row in rows.items()}
    for p in pools:
        row = rows.get(p.name)
        if row is None:
            rows[p.name] = Pool(name=p.name, kind=p.kind, gpu_types=list(p.gpu_types), weight=p.weight, cost=p.cost,
                                state=p.state, configured=True)
            session.add(rows[p.name])
            notes.append(f"pool {p.name}: added ({p.kind})")
            continue
        if row.kind != p.kind:
            notes.append(f"pool {p.name}: kind changed from {row.kind} to {p.kind}")
        row.kind, row.gpu_types, row.cost, row.configured = p.kind, list(p.gpu_types), p.cost, True
        if not row.state_by:
            row.state = p.state
        elif row.state != p.state:
            notes.append(f"pool {p.name}: state {row.state} (set by {row.state_by}) kept over the file's {p.state}")
        if not row.weight_by:
            row.weight = p.weight
    for name in vanished:
        rows[name].configured = False
        notes.append(f"pool {name}: no longer configured (no active jobs); kept for history")
    session.flush()
    for name, row in sorted(rows.items()):  # what the pools file changed, recorded as the system's
        if before.get(name) != _shown(row):
            audit.record(session, by=Who.system("pools-file"), action="pool.reconcile", target_kind="pool",
                         target_name=name, before=before.get(name), after=_shown(row))
    return notes


def _shown(row) -> dict:
    """A pool row as the audit log records it."""
    return {"kind": row.kind, "state": row.state, "weight": row.weight, "cost": row.cost,
            "gpu_types": list(row.gpu_types or []), "configured": row.configured}


def reconcile_at_startup(sessionmaker, pools) -> list[str]:
    with sessionmaker.begin() as session:
        return reconcile(session, pools)


def storage_at_startup(sessionmaker, catalog, backends) -> list[str]:
    """Check, through each pool, the storages it is said to provide (gateway/pools/config.py
    ``check_storage``) for every account the registry has. Raises BackendConfigError."""
    from sqlalchemy import inspect, select

    from gateway.models.accounts import Account
    from gateway.pools.config import check_storage

    if not catalog:
        return []
    with sessionmaker.begin() as session:
        accounts = list(session.scalars(select(Account.name))) if inspect(session.connection()).has_table(
            "account") else []
    return check_storage(catalog, backends, accounts)


def storage_health(catalog, backends, session) -> dict[tuple[str, str], dict]:
    """(storage, pool) -> {healthy, reason} for admins: each pool asked now, as at start-up."""
    from sqlalchemy import select

    from adapters.base import BackendError, VolumeMount
    from gateway.models.accounts import Account

    accounts = list(session.scalars(select(Account.name)))
    out: dict[tuple[str, str], dict] = {}
    for storage in catalog.storages.values():
        users = [a for a in accounts if storage.allows(a)] if storage.accounts is None else sorted(storage.accounts)
        for pool, p in storage.pools.items():
            backend = backends.get(pool)
            if backend is None:
                out[(storage.name, pool)] = {"healthy": False, "reason": "the pool is not configured"}
                continue
            mount = VolumeMount(storage=storage.name, path=storage.path, root=storage.path,
                                read_only=not storage.writable, provider=p.provider, claim=p.claim, server=p.server,
                                source_path=p.source_path)
            try:
                problems = backend.storage_problems(mount, users)
            except BackendError as exc:
                problems = [exc.message]
            out[(storage.name, pool)] = {"healthy": not problems, "reason": "; ".join(problems) or "ok"}
    return out


def pool_meta(session, *, queued_states: tuple[str, ...]) -> tuple[dict[str, dict], dict[str, int]]:
    """Each pool row as PoolView keyword arguments (kind, state, weight, cost, GPU types), and
    the registry's jobs in ``queued_states`` per pool: one statement, asked at every capacity
    snapshot (columns, not ORM objects). A pool with jobs but no row still gets its count."""
    from sqlalchemy import func, select

    from gateway.models.jobs import Job
    from gateway.models.pools import Pool

    depth = (select(Job.pool.label("pool"), func.count().label("n")).where(Job.state.in_(queued_states))
             .group_by(Job.pool).subquery("queued"))
    meta: dict[str, dict] = {}
    counts: dict[str, int] = {}
    for name, kind, state, weight, cost, gpu_types, pool, n in session.execute(
            select(Pool.name, Pool.kind, Pool.state, Pool.weight, Pool.cost, Pool.gpu_types, depth.c.pool, depth.c.n)
            .join(depth, depth.c.pool == Pool.name, full=True)):
        if name is not None:
            meta[name] = {"kind": kind, "state": state, "weight": weight, "cost": cost,
                          "gpu_types": tuple(gpu_types or ())}
        if pool is not None:
            counts[pool] = n
    return meta, counts


def all_pools(session) -> list:
    """Every pool the gateway knows (configured now or in the past), by name."""
    from sqlalchemy import select

    from gateway.models.pools import Pool

    return list(session.scalars(select(Pool).order_by(Pool.name)))


def get(session, name: str):
    """The pool row named ``name``, or None."""
    from gateway.models.pools import Pool

    return session.get(Pool, name)


def update(session, *, name: str, state: str | None, weight: float | None, by: Who, now):
    """An administrator's change to a pool's state or routing weight (None leaves it as it
    is), recorded with who made it; wins over the pools file on later start-ups (``reconcile``
    keeps a ``state_by`` / ``weight_by``). Raises NotFound for a pool the gateway never knew."""
    from gateway.kit.errors import NotFound

    row = get(session, name)
    if row is None:
        raise NotFound(f"no pool {name!r} (GET /v1/admin/pools lists them)")
    before = {"state": row.state, "weight": row.weight}
    if state is not None:
        row.state, row.state_by = state, by.subject
    if weight is not None:
        row.weight, row.weight_by = weight, by.subject
    row.updated_at = now
    session.flush()
    audit.record(session, by=by, action="pool.update", target_kind="pool", target_name=name, before=before,
                 after={"state": row.state, "weight": row.weight}, now=now)
    signals.notify(session, signals.POOL, name)  # every process's snapshot and dispatcher, at the commit
    return row


# A pool's stored limits older than this are not trusted at submit time: no dispatcher has
# looked at the pool lately, so the cluster may have changed (grown) since.
LIMITS_FRESH_S = 300.0
# How often a dispatcher re-writes limits that did not change (keeps them fresh).
LIMITS_REFRESH_S = 60.0


def record_limits(session, limits: dict[str, dict], *, now) -> None:
    """Store each pool's static limits as a dispatcher just saw them (PoolView.limits)."""
    from sqlalchemy import update

    from gateway.models.pools import Pool

    for name, value in limits.items():
        # updated_at stays: it says when the pool's configuration last changed, not this.
        session.execute(update(Pool).where(Pool.name == name).values(limits=value, limits_at=now,
                                                                      updated_at=Pool.updated_at))


def stored_views(session, *, now, storage=None) -> tuple[dict[str, PoolView], set[str]]:
    """(Views of the configured pools whose stored limits are fresh, the names of every
    configured pool): for the submit-time never-fits check in a process without a dispatcher.
    A pool missing from the views has no known limits: nothing may be refused on its account.
    ``storage``: the storage catalog, whose storages each view then knows (docs/storage.md)."""
    from datetime import timedelta

    from sqlalchemy import select

    from gateway.kit.timeutil import as_utc
    from gateway.models.pools import Pool

    views: dict[str, PoolView] = {}
    configured: set[str] = set()
    for name, kind, state, limits, at in session.execute(
            select(Pool.name, Pool.kind, Pool.state, Pool.limits, Pool.limits_at).where(Pool.configured.is_(True))):
        configured.add(name)
        if limits and at is not None and as_utc(at) >= now - timedelta(seconds=LIMITS_FRESH_S):
            views[name] = PoolView.from_limits(name, limits, {"kind": kind, "state": state, "storages": (
                storage.provided_by(name) if storage is not None else frozenset())})
    return views, configured


def configured_names(session) -> list[str]:
    """The names of the pools configured now, by name: one statement built once, as plain rows
    (the admin page's pool choices)."""
    from sqlalchemy import select

    from gateway.kit.db import compiled_read
    from gateway.models.pools import Pool

    read = compiled_read(session, "pools.configured_names",
                         lambda: select(Pool.name).where(Pool.configured.is_(True)).order_by(Pool.name))
    return [name for (name,) in read.tuples(session, {})]
