"""The round's plan: who starts now, who holds a reservation, and when the rest will start.

Feeds the planner (gateway/domain/planner.py: conservative backfill over every pool)
from the registry and the capacity snapshot, so a round starts only jobs that delay no
higher job's reservation (docs/dispatch.md, "Reservations and backfill"):

* pools: whole nodes on a node-exclusive pool, GPUs elsewhere (``PoolView.node_exclusive``);
* free now: the snapshot's idle nodes / free GPUs, but never more than the pool's total
  less what the registry's gangs there hold or are about to (a job just dispatched may
  not show in the snapshot yet; one that does is not counted twice);
* releases: every gang the registry has on a pool gives its units back at its expected
  end: its start plus its time limit (not started yet: now plus its time limit). On a pool
  with network domains, when the registry knows every gang's nodes (``Job.nodes``, from the
  backend's status), each release names the domains those nodes free (``Release.domains``),
  so the planner knows which domain frees when (docs/planning.md, "Topology");
* candidates: the round's pending jobs in fair-share order, each with the pools it may use
  (never-fits and quota refusals removed), or blocked with the reason (budget, quota).

The registry's side: :func:`releases`. The pure helpers over the snapshot are in
gateway/domain/plan_inputs.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import Float, bindparam, case, cast, extract, func, null, select
from sqlalchemy.orm import Session

from gateway.domain.planner import Release
from gateway.domain.routing import PoolView
from gateway.domain.states import JobState
from gateway.domain.windows import HoldGang, PlannedHold
from gateway.kit.timeutil import as_utc
from gateway.models.jobs import Job

HOLDING = (JobState.STARTING, JobState.RUNNING)  # the gang holds its units on the pool
IN_FLIGHT = (JobState.DISPATCHING, JobState.QUEUED, JobState.REQUEUED)  # will hold them, may not yet
ENDING = (JobState.CANCELLING,)  # may hold them until the backend confirms the cancel


def releases(session: Session, views: Mapping[str, PoolView], *, now: datetime) -> tuple[list[Release], dict[str, int]]:
    """(Releases of every gang the registry has on a pool, units the registry's gangs hold per pool).

    A gang that holds its units gives them back at start + time limit; one in flight
    (dispatched, not started) is counted as taking its units now and giving them back a
    time limit after it was dispatched; one being cancelled gives them back soon. Without
    the last, a whole-pool gang would find no room while a cancel is confirmed, and a
    lower job would take the node.
    """
    t_now = now.timestamp()
    # A gang past its expected end still holds its units until the backend says otherwise
    # (the snapshot is the truth for now): it frees them "soon", never "now".
    soon = t_now + 1.0
    exclusive = {name: view.node_exclusive for name, view in views.items() if view.capacity is not None}
    # Gangs of one pool that give their units back at the same moment are one release (the
    # planner's profile adds them up anyway): a round's dispatched gangs share their claim's time.
    merged: dict[tuple[str, float], int] = {}
    held: dict[str, int] = {}
    rows = _gang_rows_pg if session.get_bind().dialect.name == "postgresql" else _gang_rows
    for pool, workers, gpus, at in rows(session, t_now, soon):
        node_exclusive = exclusive.get(pool)
        if node_exclusive is None:  # not a pool of this round, or no snapshot
            continue
        units = int(workers if node_exclusive else gpus)  # whole nodes, else the GPUs it holds
        held[pool] = held.get(pool, 0) + units
        merged[(pool, at)] = merged.get((pool, at), 0) + units
    named = _named_releases(session, views, t_now, soon)
    out = [Release(pool, units, at) for (pool, at), units in merged.items() if pool not in named]
    return out + [r for rs in named.values() for r in rs], held


def _node_domains(view: PoolView) -> dict[str, list[tuple[str, str]]]:
    """Node -> (level, domain) of every domain it is in, from the pool's capacity snapshot."""
    out: dict[str, list[tuple[str, str]]] = {}
    for p in view.capacity.pools if view.capacity is not None else ():
        for d in p.topology:
            for node in d.nodes:
                out.setdefault(node, []).append((d.level, d.name))
    return out


def _named_releases(session: Session, views: Mapping[str, PoolView], t_now: float,
                    soon: float) -> dict[str, list[Release]]:
    """Pool -> its releases naming the domains each gang's nodes free, for the pools with
    domains on which the registry knows the nodes of every gang (a gang in flight has none
    yet: that pool keeps its plain releases, the planner's fallback). Ends as :func:`_gang_rows`."""
    maps = {name: m for name, view in views.items()
            if view.node_exclusive and view.domains and (m := _node_domains(view))}
    if not maps:
        return {}
    out: dict[str, list[Release]] = {name: [] for name in maps}
    for pool, _, workers, _, _, end, _, nodes in _gangs(session, t_now, soon, Job.pool.in_(sorted(maps))):
        if pool not in out:
            continue
        m = maps[pool]
        if not nodes or len(nodes) != workers or any(n not in m for n in nodes):
            del out[pool]
            continue
        counts = Counter(key for n in nodes for key in m[n])
        out[pool].append(Release(pool, int(workers), end, tuple((lvl, dom, k) for (lvl, dom), k in sorted(counts.items()))))
    return out


_GANG_STATES = [s.value for s in HOLDING + IN_FLIGHT + ENDING]
_HOLDING_STATES = frozenset(s.value for s in HOLDING)
_ENDING_STATES = frozenset(s.value for s in ENDING)


def _gang_rows(session: Session, t_now: float, soon: float):
    """(pool, workers, GPUs held, expected end) of every gang on a pool; never before ``soon``.

    The end is a base plus the time limit, in seconds since the epoch. The base: a gang
    that holds its units, its start; one in flight, its last change (the claim, the
    submission), not now: an end that moved with every round would let one job after
    another backfill in front of a reservation for ever. Unknown: now. A gang being
    cancelled ends soon.
    """
    for pool, _, workers, gpus, _, end, _, _ in _gangs(session, t_now, soon):
        yield pool, workers, gpus, end


def _gangs(session: Session, t_now: float, soon: float, *where):
    """(pool, account, workers, GPUs held, base, expected end, being cancelled, nodes) of every
    gang (``where``: more conditions); base and end as :func:`_gang_rows` says."""
    stmt = select(Job.pool, Job.account_name, Job.state, Job.workers, Job.total_gpus, Job.held_gpus, Job.started_at,
                  Job.updated_at, Job.time_limit_s, Job.nodes).where(Job.state.in_(_GANG_STATES), *where)
    for pool, account, state, workers, total, gpus_held, started, updated, limit, nodes in session.execute(stmt).all():
        at = started if state in _HOLDING_STATES else updated
        base = as_utc(at).timestamp() if at is not None else t_now
        ending = state in _ENDING_STATES
        # A gang being cancelled is gone once the backend confirms the cancel.
        end = soon if ending else max(soon, base + limit)
        yield pool, account, workers, gpus_held or total, base, end, ending, nodes


# The same rows computed by Postgres, so a round does not build two datetimes per gang in
# Python (thousands of gangs: bench/bench_dispatch_round.py). EXTRACT(EPOCH ...) is the exact
# number of microseconds / 10**6 and its float8 the correctly rounded value, which is what
# datetime.timestamp() returns (tests/dispatch/test_round_cost.py checks them to the microsecond).
def _epoch(column):
    return func.coalesce(cast(extract("epoch", column), Float), bindparam("t_now", type_=Float))


_END_PG = func.greatest(  # GREATEST ignores NULL: a gang being cancelled ends soon
    bindparam("soon", type_=Float),
    case((Job.state.in_(sorted(_ENDING_STATES)), null()),
         (Job.state.in_(sorted(_HOLDING_STATES)), _epoch(Job.started_at)), else_=_epoch(Job.updated_at))
    + Job.time_limit_s)
_GANG_ROWS_PG = (
    select(Job.pool, func.sum(Job.workers), func.sum(func.coalesce(func.nullif(Job.held_gpus, 0), Job.total_gpus)),
           _END_PG.label("ends_at"))
    .where(Job.state.in_(_GANG_STATES))
    .group_by(Job.pool, "ends_at")
)


def _gang_rows_pg(session: Session, t_now: float, soon: float):
    """:func:`_gang_rows` summed by Postgres per pool and end: one row per release, not per gang."""
    return session.execute(_GANG_ROWS_PG, {"t_now": t_now, "soon": soon}).all()


def hold_gangs(session: Session, views: Mapping[str, PoolView], planned: Sequence[PlannedHold], *,
               now: datetime) -> list[HoldGang]:
    """The gangs of the holds' accounts on the holds' pools (gateway/domain/windows.py ``holds``
    decides which ran in a hold). Their ends are computed as :func:`_gang_rows` computes the
    releases' (the planner moves exactly those units from the pool to the hold)."""
    if not planned:
        return []
    t_now = now.timestamp()
    out = []
    for pool, account, workers, gpus, began, end, ending, _ in _gangs(
            session, t_now, t_now + 1.0, Job.pool.in_(sorted({h.pool for h in planned})),
            Job.account_name.in_(sorted({h.account for h in planned}))):
        view = views.get(pool)
        if view is None or view.capacity is None or ending:
            continue
        out.append(HoldGang(pool, account, int(workers if view.node_exclusive else gpus), began, end))
    return out
