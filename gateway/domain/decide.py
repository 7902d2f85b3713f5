"""The claim round's decision: over a snapshot of the round, which jobs start where, and why the rest wait.

snapshot -> decide -> apply (gateway/dispatch/claim.py), the shape of Armada's
``SchedulingAlgo.Schedule(ctx, txn) -> SchedulerResult``: :func:`decide` reads the jobs
the round picked, the pools' capacity views and what the planner needs, and returns a
:class:`RoundResult` (claims with their pool, held GPUs and reason; waiting notes;
estimates; jobs that can never run). It runs no SQL and changes no job: the caller writes
the result in bulk (``jobs.claims.Claims``, ``RoundLedger``, ``jobs.finish``).

The quota rules are pure too (gateway/domain/quota.py): the snapshot carries the ledger's
view of the picked accounts' chains (``Snapshot.quota``), a :class:`~gateway.domain.quota.Tally`
over it answers for each job with what the round reserved before it counted, and the
result lists the reservations the round wants (``RoundResult.reservations``). The apply
step writes them under the chains' locks and judges the limited chains again there
(gateway/ledger/round.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gateway.domain import plan_inputs as planning
from gateway.domain.guarantee import Guarantees
from gateway.domain.planner import Candidate, Hold, Outage, Release, plan
from gateway.domain.preempt import Eviction, ReclaimRound, Room, Running
from gateway.domain.quota import ChainView, Reservation, Tally
from gateway.domain.routing import (
    JobShape,
    PoolView,
    domain_wait,
    held_gpus,
    ranked,
    route,
    take,
)
from gateway.domain.windows import crossing_words

_POSITION = " (fair-share position {})"


@dataclasses.dataclass(frozen=True)
class Params:
    """The settings a round's decision depends on."""

    weights: Any
    queue_depth: int
    cost_factor: float
    reservation_depth: int = 0
    max_starts: int = 0
    # Reclaim (docs/recovery.md): a victim has run at least this long; at most this many per pool a minute.
    preempt_min_runtime_s: float = 600.0
    preempt_max_per_pool_per_minute: int = 4


@dataclasses.dataclass
class Snapshot:
    """What the round read: the picked jobs in fair-share order, the pools' views (the
    decision takes capacity from them: give it copies), and, for the reservation policy,
    the planner's inputs."""

    now: datetime
    picked: Sequence[Any]
    views: dict[str, PoolView]
    planned: bool = False
    releases: list[Release] = dataclasses.field(default_factory=list)
    registry_held: dict[str, int] = dataclasses.field(default_factory=dict)
    recent_ends: list[Any] = dataclasses.field(default_factory=list)
    monotonic_now: float = 0.0
    # Each picked job's shape, read with the snapshot (a set task's shape comes from its
    # set's template, a read): the decision itself touches no session.
    shapes: dict[str, JobShape] = dataclasses.field(default_factory=dict)
    # Guarantees and what reclaim may stop (gateway/ledger/guarantees.py); None: no guarantee
    # is set anywhere, so every claim is unrecorded (borrowed None) and nothing is reclaimed.
    guarantees: Guarantees | None = None
    running: Sequence[Running] = ()  # borrowed gangs running now, not being stopped already
    # job -> the victims it waits for (still stopping, or stopped less than a minute ago)
    reclaiming: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    recent_evictions: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    # Maintenances and reservations that have not ended (gateway/domain/windows.py): with
    # any, the round is planned (a greedy round cannot see time), docs/planning.md.
    windows: list[Outage] = dataclasses.field(default_factory=list)
    holds: list[Hold] = dataclasses.field(default_factory=list)  # advance reservations
    # The ledger's view of the picked accounts' chains (gateway/ledger/round.py reads it).
    quota: ChainView = dataclasses.field(default_factory=lambda: ChainView(parent={}))


@dataclasses.dataclass(frozen=True)
class Claim:
    job: Any
    pool: str
    held_gpus: int
    reason: str
    position: int
    borrowed: bool | None = None  # None: no guarantee is set anywhere
    guarantee: str = ""  # why within its guarantee or borrowed, in words
    hold: str = ""  # the advance reservation it starts in ("": the pool's open capacity)


@dataclasses.dataclass(frozen=True)
class Reclaim:
    """Borrowed gangs to stop so that ``job``, within its guarantee, can start."""

    job: Any
    eviction: Eviction


@dataclasses.dataclass(frozen=True)
class Waiting:
    job: Any
    reason: str


@dataclasses.dataclass(frozen=True)
class Estimate:
    job: Any
    start: datetime | None
    pool: str | None
    reason: str


@dataclasses.dataclass(frozen=True)
class Failure:
    job: Any
    reason: str


@dataclasses.dataclass
class RoundResult:
    """What the round writes, each list in the order decided."""

    claims: list[Claim] = dataclasses.field(default_factory=list)
    waiting: list[Waiting] = dataclasses.field(default_factory=list)
    estimates: list[Estimate] = dataclasses.field(default_factory=list)
    failures: list[Failure] = dataclasses.field(default_factory=list)
    reclaims: list[Reclaim] = dataclasses.field(default_factory=list)
    # Jobs that wait for capacity only (not for quota, budget or a pool's state), in order:
    # the ones reclaim may help.
    short: list[Any] = dataclasses.field(default_factory=list)
    # The gangs the claims reserve, in the round's order (written under the chains' locks).
    reservations: list[Reservation] = dataclasses.field(default_factory=list)


def decide(snap: Snapshot, params: Params) -> RoundResult:
    """The round's decision: greedy in fair-share order, or the reservation plan (``snap.planned``).

    Where guarantees are set, work that may run within its guarantee is placed before
    borrowed work (fair share orders each), and a gang within its guarantee that fits
    nowhere may reclaim borrowed GPUs (:func:`_reclaim`).
    """
    result = RoundResult()
    ledger = Tally(snap.quota)
    if snap.guarantees is not None:
        snap = dataclasses.replace(snap, picked=_guaranteed_first(snap))
    if snap.planned:
        _plan_round(snap, ledger, params, result)
    else:
        for position, job in enumerate(snap.picked, start=1):
            _claim_one(snap, job, position, ledger, params, result)
    if snap.guarantees is not None and snap.running:
        _reclaim(snap, ledger, params, result)
    result.reservations = ledger.reservations
    return result


def _guaranteed_first(snap: Snapshot) -> list[Any]:
    """The picked jobs, those that may run within a guarantee first (stable: fair share orders each)."""
    g, names = snap.guarantees, list(snap.views)
    within = [job for job in snap.picked if g.may_be_within(job.account_name, names, job.total_gpus)]
    ids = {job.id for job in within}
    return within + [job for job in snap.picked if job.id not in ids]


def _claim_one(snap: Snapshot, job: Any, position: int, ledger: Tally, params: Params, result: RoundResult,
               only: str | None = None, shape: JobShape | None = None, hold: str = "") -> str | None:
    """Admit, route and reserve one job. Returns why it waits (without its position), or None
    when it was claimed or can never run."""
    views = snap.views
    shape = shape or snap.shapes[job.id]
    verdict = ledger.budget_verdict(job, shape.gpu_type)
    if verdict is not None and verdict[0] == "never":
        result.failures.append(Failure(job, f"cannot run: {verdict[1]}"))
        return None
    if verdict is not None:  # not this period: held with the reason, never "waiting for capacity"
        return _wait(result, job, f"held: {verdict[1]}")
    refusals: dict[str, str] = {}
    # For a pinned job, reserve() applies the same rule; checking first only helps routing
    # choose between pools. Asked pool by pool only when a limit is set in the account's
    # chain (read once per round: with many pools, the check per pool was most of a round's queries).
    if job.requested_pool == "auto" and len(views) > 1 and ledger.limited(job.account_name):
        for name, view in views.items():
            ok, why = ledger.admission_check(job, name, held_gpus(shape, view), shape.gpu_type)
            if not ok:
                refusals[name] = why
    decision = route(shape, job.requested_pool, views, quota_refusals=refusals, weights=params.weights,
                     queue_depth=params.queue_depth, cost_factor=params.cost_factor, only=only)
    if decision.rejected:
        result.failures.append(Failure(job, f"cannot run: {decision.reason}"))
        return None
    if decision.pool is None:
        result.short.append(job)
        return _wait(result, job, decision.reason, position)
    # What the gang will hold there: whole nodes on a node-exclusive pool.
    held = held_gpus(shape, views[decision.pool])
    refused = ledger.reserve(job, decision.pool, held, shape.gpu_type)
    if refused is not None:
        return _wait(result, job, f"quota: {refused}")
    g, borrowed, words = snap.guarantees, None, ""
    if g is not None:
        borrowed = not g.within(job.account_name, decision.pool, held)
        words = g.words(job.account_name, decision.pool, held)
        if not borrowed:
            g.take(job.account_name, decision.pool, held)
    result.claims.append(Claim(job, decision.pool, held, decision.reason, position, borrowed, words, hold))
    take(shape, views[decision.pool])
    return None


def _wait(result: RoundResult, job: Any, why: str, position: int | None = None) -> str:
    result.waiting.append(Waiting(job, why if position is None else why + _POSITION.format(position)))
    return why


def _plan_round(snap: Snapshot, ledger: Tally, params: Params, result: RoundResult) -> None:
    """Claim what the plan starts now; note a planned start (estimate) on the rest.

    Conservative backfill over every pool (gateway/dispatch/planning.py,
    gateway/scheduling/planner.py): the top ``reservation_depth`` jobs that cannot
    start now hold a reservation no lower job may delay.
    """
    views, now = snap.views, snap.now
    candidates: list[Candidate] = []
    blocked: dict[str, str] = {}  # job id -> why it cannot be admitted now
    usable_of: dict[str, tuple[str, ...]] = {}
    shapes: dict[str, JobShape] = {}
    # ranked() per (shape, pool asked for): the views do not move before the plan is made.
    ranking: dict[tuple[JobShape, str], list[str]] = {}
    known = ledger.known_pools()
    for job in snap.picked:
        shape = shapes[job.id] = snap.shapes[job.id]
        verdict = ledger.budget_verdict(job, shape.gpu_type)
        if verdict is not None:
            # "never" fails it below (the greedy path's words); else held this period.
            blocked[job.id] = f"held: {verdict[1]}"
            candidates.append(planning.candidate(job, (), blocked[job.id]))
            continue
        requested = job.requested_pool
        # The pools route() may use (kind, fit, state), best first by its score: the
        # planner breaks ties between equally early starts by this order.
        names = ranking.get((shape, requested))
        if names is None:
            names = ranking[(shape, requested)] = ranked(shape, requested, views, weights=params.weights,
                                                         cost_factor=params.cost_factor)
        refusals: list[str] = []
        limited = ledger.limited(job.account_name)
        if not limited and known.issuperset(names):  # nothing in the chain can refuse it
            usable_of[job.id] = tuple(n for n in names if views[n].capacity is not None)
            candidates.append(planning.candidate(job, usable_of[job.id], shape=shape))
            continue
        usable: list[str] = []
        for name in names:
            view = views[name]
            if view.capacity is None:
                continue
            if not limited and name in known:
                usable.append(name)
                continue
            ok, why = ledger.admission_check(job, name, held_gpus(shape, view), shape.gpu_type)
            if ok:
                usable.append(name)
            else:
                refusals.append(f"{name}: {why}")
        usable_of[job.id] = tuple(usable)
        if not usable and refusals:
            blocked[job.id] = "quota: " + "; ".join(refusals)
        candidates.append(planning.candidate(job, tuple(usable), blocked.get(job.id, ""), shape=shape))
    lagging, registry_held = planning.lagging_ends(views, snap.registry_held, snap.recent_ends, now=now,
                                                   monotonic_now=snap.monotonic_now)
    planned = plan(now=now.timestamp(), pools=planning.pool_models(views),
                   free_now=planning.free_now(views, registry_held), releases=snap.releases + lagging,
                   candidates=candidates, depth=params.reservation_depth, max_starts=params.max_starts,
                   windows=snap.windows, holds=snap.holds, domains=planning.domains(views))
    starts = {p.job_id: p for p in planned.starts}
    reserved = {p.job_id: p for p in planned.reservations}
    for position, job in enumerate(snap.picked, start=1):
        start = starts.get(job.id)
        if start is not None or job.id in blocked or not usable_of.get(job.id):
            # Starts now (routed to the planned pool), or the greedy path's own words:
            # fail what can never run, hold what is over budget or quota.
            # The reason still says why not the other pools.
            why = _claim_one(snap, job, position, ledger, params, result,
                             only=start.pool if start is not None else None, shape=shapes[job.id],
                             hold=start.hold if start is not None else "")
            if why is not None:
                result.estimates.append(Estimate(job, None, None, why))
            continue
        held = reserved.get(job.id)
        decision = route(shapes[job.id], job.requested_pool, views, weights=params.weights,
                         queue_depth=params.queue_depth)
        crossed = crossing_words(planned.crossing.get(job.id, ()), job.time_limit_s)
        if held is not None:
            at = datetime.fromtimestamp(held.start, tz=UTC)
            why = (f"reserved on {held.pool}: planned start {at.isoformat(timespec='seconds')}, the earliest "
                   f"of the pools it may use ({', '.join(usable_of[job.id])}) as running jobs reach their "
                   "time limits")
            if held.hold:
                why = (f"in {job.account_name}'s advance reservation {held.hold} on {held.pool}: planned start "
                       f"{at.isoformat(timespec='seconds')}, as the reservation begins or its running jobs reach "
                       "their time limits")
            elif wait := domain_wait(shapes[job.id], views[held.pool]):
                why = f"{wait}. {why}"
            elif crossed:
                why = (f"{crossed}. Reserved on {held.pool}: planned start {at.isoformat(timespec='seconds')}, "
                       f"the earliest of the pools it may use ({', '.join(usable_of[job.id])}) as windows end "
                       "and running jobs reach their time limits")
            result.estimates.append(Estimate(job, at, held.pool, why))
            result.short.append(job)
            _wait(result, job, f"waiting for capacity: {why}", position)
            continue
        no_estimate = planned.unplanned.get(job.id) or (
            f"behind the {params.reservation_depth} jobs that hold reservations; no estimate yet")
        if crossed:
            no_estimate = f"{crossed}; {no_estimate}"
        result.estimates.append(Estimate(job, None, None, no_estimate))
        if crossed and decision.pool is not None:  # it fits now, but a window comes before its limit ends
            why = f"waiting for capacity: {no_estimate}"
        elif decision.pool is not None:  # it fits now, but only on capacity a higher job has reserved
            why = f"waiting for capacity: held back, starting now would delay a higher job's reservation; {no_estimate}"
        else:
            why = decision.reason
        result.short.append(job)
        _wait(result, job, why, position)


def _reclaim(snap: Snapshot, ledger: Tally, params: Params, result: RoundResult) -> None:
    """Borrowed GPUs back for work within its guarantee (docs/recovery.md, "Reclaim").

    Each job that waits for capacity only and would run within its guarantee on a pool it
    may use asks the round's :class:`gateway.domain.preempt.ReclaimRound` (the simulator's
    too) for one eviction set across those pools (borrowed victims of other accounts only,
    the cheapest by the GPU-hours they would lose, never younger than the minimum runtime,
    never more than needed, at most so many per pool a minute). A job whose victims are still stopping waits for them.
    The job keeps waiting (its reason says for whom it stops what); once the victims have
    ended, work within a guarantee is placed first, so it takes what they gave back.
    """
    g, views = snap.guarantees, snap.views
    asks = ReclaimRound(lambda: snap.running, now=snap.now.timestamp(), min_runtime_s=params.preempt_min_runtime_s,
                        max_per_pool_per_minute=params.preempt_max_per_pool_per_minute,
                        recent=snap.recent_evictions)
    notes = {w.job.id: i for i, w in enumerate(result.waiting)}
    for job in result.short:
        if job.id in snap.reclaiming:
            victims = ", ".join(snap.reclaiming[job.id])
            why = f"reclaiming borrowed GPUs: waiting for the jobs it stops ({victims}) to give them back"
            if job.id in notes:
                result.waiting[notes[job.id]] = Waiting(job, why)
            continue
        shape = snap.shapes[job.id]
        rooms: dict[str, Room] = {}
        for name in ranked(shape, job.requested_pool, views, weights=params.weights, cost_factor=params.cost_factor):
            view = views[name]
            held = held_gpus(shape, view)
            if view.capacity is None or not g.within(job.account_name, name, held):
                continue
            if ledger.limited(job.account_name) and not ledger.admission_check(job, name, held, shape.gpu_type)[0]:
                continue  # its own limits would refuse it there: stopping others would not help
            rooms[name] = Room(name, view.node_exclusive, view.free_gpus, view.idle_nodes)
        eviction = asks.ask(account=job.account_name, workers=shape.workers,
                            gpus_per_worker=max(shape.gpus_per_worker, 0), rooms=rooms)
        if eviction is None:
            continue
        result.reclaims.append(Reclaim(job, eviction))
        why = f"reclaiming borrowed GPUs {eviction.reason}; it starts when they have stopped"
        if job.id in notes:
            result.waiting[notes[job.id]] = Waiting(job, why)
        else:
            result.waiting.append(Waiting(job, why))
