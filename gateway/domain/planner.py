"""Who starts next, and when the rest will: conservative backfill over every pool.

A pure function of numbers (no database, no backend, no clock of its own), so the
dispatcher and the scheduling simulator (``bench/simulate.py``) run the same code.

The model, per pool:

* capacity is counted in *units*: whole nodes on a node-exclusive pool (a Slurm gang of
  W workers holds W nodes), GPUs elsewhere (Kueue admits a gang by its GPU total);
* an *availability profile* says how many units are free from each moment on. It starts
  at what is free now and gains a running gang's units at its expected end (start plus
  time limit, or the backend's own estimate); capacity held by something with no known
  end (another cluster user's job) never comes back in the plan;
* a job fits at time ``t`` on a pool when the profile has its units free for the whole of
  ``[t, t + time limit)``.

A round walks the waiting jobs in fair-share order. Each job goes to the pool where it
starts earliest (ties: the caller's pool preference). If that is now, it starts now and its
units are booked until its time limit. If it is later, and fewer than ``depth`` jobs hold a
reservation, it gets one: its units are booked from its planned start, so every job behind
it can only use what does not delay it (it ends before the planned start, or uses units
the reservation does not need). That is conservative backfill: no reservation is ever
pushed back by a lower job, so a gang's wait is bounded by the time limits of what runs.

Windows (docs/planning.md): a maintenance or a reservation takes units from a pool over
``[start, end)``; they are booked in the profile like a reservation that nothing may delay,
so no gang whose time limit would cross a window starts on the capacity it takes, start
estimates move behind it, and shorter jobs still use the time before it (backfill). A
backend's own window that is active now is already missing from the snapshot's free units:
those come back at its end instead.

Holds (advance reservations, docs/planning.md): units of a pool held for some accounts over
``[start, end)``. To everyone else a hold is a window. Its accounts' gangs use it first: a
gang of theirs goes into the hold when its whole time limit fits inside it no later than it
could start elsewhere. A hold has its own profile (its units from its start, minus its
accounts' gangs in it, none after its end). A gang already running in a hold (``in_use``)
is counted there and not twice on the pool.

Topology (docs/planning.md): a node-exclusive pool may have network domains (``domains``:
idle nodes per domain now). A gang that requires a level starts only where one domain of it
holds the whole gang for its whole time limit. When every release of the pool names the
domains it frees (:class:`Release`), each domain has a profile of its own (:class:`Domains`):
the gang is planned from the first moment its domain and the pool both have room, and booked
into that domain; a start now goes where the backend would put it and must not take a booked
gang's domain. Otherwise only now is known, and a waiting gang is planned from the pool's next
release (the fallback). :func:`pick_domains` is the one placement rule.

``depth=0`` is the old greedy policy (whatever fits now starts; nothing waits for a gang),
and ``policy="fifo"`` stops at the first job that cannot start now.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

INF = math.inf


@dataclasses.dataclass(frozen=True)
class PoolModel:
    """What the planner needs to know of a pool."""

    name: str
    node_exclusive: bool
    total_units: int  # nodes when node_exclusive, else GPUs
    gpus_per_node: int = 0

    def units(self, workers: int, gpus_per_worker: int) -> int:
        return workers if self.node_exclusive else workers * gpus_per_worker


@dataclasses.dataclass(frozen=True)
class Release:
    """Units a running gang gives back at ``at`` (its expected end).

    ``domains``: (level, domain, nodes) its nodes give back to each network domain, at every
    level of the pool's topology, when the caller knows the gang's nodes; () when not (the
    planner then falls back to the pool's next release for that pool's domain rule).
    """

    pool: str
    units: int
    at: float
    domains: tuple[tuple[str, str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Outage:
    """Units a window takes from a pool over ``[start, end)``, and the window in words.

    ``in_snapshot``: active now and already not free in the capacity snapshot (a backend's
    own reservation): its units come back at ``end`` rather than being taken.
    """

    pool: str
    units: int
    start: float
    end: float
    words: str
    in_snapshot: bool = False


@dataclasses.dataclass(frozen=True)
class Hold:
    """Units of ``pool`` held for ``accounts`` over ``[start, end)`` (an advance reservation).

    ``in_use``: (expected end, units) of the accounts' gangs running in it now; the snapshot
    already counts them as used on the pool.
    """

    id: str
    pool: str
    accounts: frozenset[str]
    units: int
    start: float
    end: float
    words: str
    in_use: tuple[tuple[float, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A waiting job, as the planner sees it.

    ``pools`` lists the pools it may use (never-fits, pinning, kind and GPU type already
    applied), in the caller's order of preference. ``blocked`` is a reason it cannot be
    admitted at all now (quota, budget, dependency): such a job is looked past and holds
    no reservation.
    """

    id: str
    workers: int
    gpus_per_worker: int
    time_limit_s: float
    pools: tuple[str, ...]
    blocked: str = ""
    account: str = ""  # whose holds it may use
    topology: str = ""  # a level of which ONE domain must hold the whole gang ("": any nodes)


@dataclasses.dataclass(frozen=True)
class Placement:
    job_id: str
    pool: str
    start: float  # == now for a start, later for a reservation
    reserved: bool  # True: a planned start, booked in the profile
    reason: str
    # The windows a start now would cross on the chosen pool, in words (why it is not now).
    windows: tuple[str, ...] = ()
    hold: str = ""  # the hold it starts in ("" : the pool's open capacity)


@dataclasses.dataclass
class Plan:
    starts: list[Placement] = dataclasses.field(default_factory=list)
    reservations: list[Placement] = dataclasses.field(default_factory=list)
    # job id -> why it has no estimate (blocked, beyond the depth, never room)
    unplanned: dict[str, str] = dataclasses.field(default_factory=dict)
    # job id -> the windows a start now would cross on the pools it may use (waiting jobs only)
    crossing: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    examined: int = 0

    def estimate(self, job_id: str) -> Placement | None:
        for p in self.reservations:
            if p.job_id == job_id:
                return p
        return None


def pick_domains(domains: Mapping[str, Mapping[str, int]], workers: int,
                 required: str = "") -> list[tuple[str, str, int]]:
    """Where a gang of ``workers`` whole nodes goes, as (level, domain, nodes): at each level,
    the fullest domain that holds it all (best fit, as Slurm's topology plugins choose), else
    the emptiest first. ``required``: that level's domain must hold it all (the caller checked
    one does; if none does, that level gets nothing)."""
    out = []
    for level, idle in domains.items():
        fits = sorted((n, name) for name, n in idle.items() if n >= workers)
        if fits:
            out.append((level, fits[0][1], workers))
            continue
        if level == required:
            continue
        left = workers
        for n, name in sorted(((n, name) for name, n in idle.items()), reverse=True):
            took = min(n, left)
            if took > 0:
                out.append((level, name, took))
            left -= took
            if left <= 0:
                break
    return out


def take_domains(domains: dict[str, dict[str, int]], workers: int, required: str = "") -> None:
    """A gang of ``workers`` whole nodes leaves the domains' idle counts (:func:`pick_domains`)."""
    for level, name, n in pick_domains(domains, workers, required):
        domains[level][name] -= n


class Profile:
    """Free units over time: a step function, ``free[i]`` from ``times[i]`` on."""

    __slots__ = ("free", "times", "total")

    def __init__(self, now: float, free_now: int, releases: Iterable[tuple[float, int]], total: int):
        self.total = total
        steps: dict[float, int] = {}
        for at, units in releases:
            at = max(at, now)
            steps[at] = steps.get(at, 0) + units
        self.times = [now]
        self.free = [max(0, free_now + steps.pop(now, 0))]
        for at in sorted(steps):
            self.times.append(at)
            self.free.append(self.free[-1] + steps[at])
        # Never more than the pool has (a release of a job the snapshot already saw free).
        self.free = [min(f, total) for f in self.free]

    def free_now(self) -> int:
        return self.free[0]

    def earliest(self, need: int, duration: float, after: float | None = None,
                 not_before: float | None = None) -> float:
        """The first moment (later than ``after``, if given: a step of the profile; no earlier
        than ``not_before``, if given: any moment) from which ``need`` units stay free for
        ``duration``; INF if never."""
        if need > self.total:
            return INF
        times, free = self.times, self.free
        n = len(times)
        lo = -INF
        if after is not None:
            i = bisect.bisect_right(times, after)
        elif not_before is not None:
            i, lo = max(0, bisect.bisect_right(times, not_before) - 1), not_before
        else:
            i = 0
        while i < n:
            if free[i] < need:
                i += 1
                continue
            start = max(times[i], lo)
            end = start + duration
            j = i + 1
            while j < n and times[j] < end and free[j] >= need:
                j += 1
            if j >= n or times[j] >= end:
                return start
            i = j + 1  # free[j] < need: no start before times[j] can span it
        return INF

    def least(self, start: float, end: float) -> int:
        """The fewest units free at any moment of ``[start, end)``."""
        times, free = self.times, self.free
        i = max(0, bisect.bisect_right(times, start) - 1)
        m = free[i]
        for j in range(i + 1, len(times)):
            if times[j] >= end:
                break
            m = min(m, free[j])
        return m

    def book(self, start: float, duration: float, units: int) -> None:
        """Take ``units`` over ``[start, start + duration)``."""
        end = start + duration
        i = self._split(start)
        j = self._split(end) if end < INF else len(self.times)
        for k in range(i, j):
            self.free[k] -= units

    def _split(self, at: float) -> int:
        """Index of the step that starts exactly at ``at`` (made if needed)."""
        k = bisect.bisect_left(self.times, at)
        if k < len(self.times) and self.times[k] == at:
            return k
        self.times.insert(k, at)
        self.free.insert(k, self.free[k - 1])
        return k


class Domains:
    """A pool's network domains over time: a :class:`Profile` of idle nodes per domain.

    Each starts at the domain's idle nodes now and gains what the releases that name it give
    back (:attr:`Release.domains`). ``futures``: every release of the pool named its domains,
    so a domain's profile is its whole future; else only now is known (the fallback).
    Bookings go through :func:`pick_domains`, the one placement rule (routing's too).
    """

    __slots__ = ("futures", "levels")

    def __init__(self, now: float, idle: Mapping[str, Mapping[str, int]], releases: Sequence[Release], total: int):
        steps: dict[tuple[str, str], list[tuple[float, int]]] = {}
        for r in releases:
            for level, name, n in r.domains:
                steps.setdefault((level, name), []).append((r.at, n))
        self.futures = all(r.domains for r in releases if r.units > 0)
        self.levels = {level: {name: Profile(now, n, steps.get((level, name), ()), total) for name, n in d.items()}
                       for level, d in idle.items()}

    def earliest(self, level: str, need: int, duration: float, not_before: float) -> float:
        """The first moment from ``not_before`` on at which one domain of ``level`` has ``need``
        idle nodes for ``duration`` (INF: never, or no such level)."""
        return min((p.earliest(need, duration, not_before=not_before)
                    for p in self.levels.get(level, {}).values()), default=INF)

    def _picks(self, start: float, end: float, workers: int, required: str) -> list[tuple[str, str, int]]:
        idle = {level: {name: p.least(start, end) for name, p in d.items()} for level, d in self.levels.items()}
        return pick_domains(idle, workers, required)

    def fits_now(self, now: float, duration: float, workers: int, required: str = "") -> bool:
        """Whether a start now, where the backend puts it (by the idle nodes of this moment),
        keeps its nodes for its whole limit without taking any a booked gang's domain needs."""
        picks = self._picks(now, now, workers, required)
        if required and not any(level == required for level, _, _ in picks):
            return False
        return all(self.levels[level][name].least(now, now + duration) >= n for level, name, n in picks)

    def book(self, start: float, duration: float, workers: int, required: str = "", now: bool = False) -> None:
        """The gang's nodes leave its domains over ``[start, start + duration)``: where its whole
        limit fits (a planned start), or, ``now``, where the backend puts a start: by the idle
        nodes of this moment (the backend knows nothing of the plan's later bookings)."""
        for level, name, n in self._picks(start, start if now else start + duration, workers, required):
            self.levels[level][name].book(start, duration, n)


def plan(*, now: float, pools: Sequence[PoolModel], free_now: Mapping[str, int],
         releases: Iterable[Release], candidates: Iterable[Candidate], depth: int = 8,
         policy: str = "reservation", max_starts: int | None = None, max_examined: int | None = None,
         windows: Iterable[Outage] = (), holds: Iterable[Hold] = (),
         domains: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None) -> Plan:
    """One scheduling round (see the module docstring).

    Args:
        now: the round's time (seconds, any epoch shared with the releases).
        free_now: units free on each pool now (from the capacity snapshot).
        releases: running gangs' units and expected ends.
        candidates: waiting jobs in fair-share order (highest first).
        depth: how many waiting jobs may hold a reservation ("reservation" policy).
        policy: "reservation" (conservative backfill), "greedy" (no reservations) or
            "fifo" (stop at the first job that cannot start now).
        max_starts: stop after this many starts (the dispatcher's batch).
        max_examined: look at no more than this many candidates (a bounded round).
        windows: maintenances and reservations (see :class:`Outage`).
        holds: advance reservations for accounts (see :class:`Hold`).
        domains: pool -> topology level -> domain -> room now in the pool's units (whole idle
            nodes on a node-exclusive pool, free GPUs on one that places GPUs one by one), for
            the pools that declare a topology. A candidate with ``topology`` starts only where
            one domain of that level holds it all for its whole time limit. When every release
            of the pool names its domains (:class:`Domains`), its planned start is the first
            such moment, and it is booked into that domain; else (the fallback) it starts now
            only if one domain is idle enough now, and is planned from the pool's next release.
    """
    if policy not in ("reservation", "greedy", "fifo"):
        raise ValueError(f"unknown policy {policy!r}")
    if policy == "greedy":
        depth = 0
    by_name = {p.name: p for p in pools}
    per_pool: dict[str, list[tuple[float, int]]] = {p.name: [] for p in pools}
    released: dict[str, list[Release]] = {p.name: [] for p in pools}
    for r in releases:
        if r.pool in per_pool:
            per_pool[r.pool].append((r.at, r.units))
            released[r.pool].append(r)
    taken: list[Outage] = []
    of_pool: dict[str, list[Outage]] = {}
    live = [h for h in holds if h.pool in per_pool and h.end > now and h.units > 0]
    kept: list[tuple[Hold, Profile]] = []
    for h in live:
        used = min(h.units, sum(u for _, u in h.in_use))
        # Its gangs' units are used on the pool in the snapshot and come back to the pool at their
        # ends (their releases): they are the hold's, inside the units it books on the pool, so the
        # pool gets them now and not again at those ends (``at`` is their release's own time).
        for at, u in h.in_use:
            per_pool[h.pool] += [(now, u), (at, -u)]
        prof = Profile(now, h.units - used if h.start <= now else 0,
                       [(at, u) for at, u in h.in_use] + ([(h.start, h.units)] if h.start > now else []), h.units)
        prof.book(h.end, INF, h.units)  # nothing of it after its end
        kept.append((h, prof))
    for w in windows:
        if w.pool not in per_pool or w.end <= now or w.units <= 0:
            continue
        of_pool.setdefault(w.pool, []).append(w)
        if w.in_snapshot and w.start <= now:
            per_pool[w.pool].append((w.end, w.units))  # not free now; back at its end
        else:
            taken.append(w)
    profiles = {p.name: Profile(now, free_now.get(p.name, 0), per_pool[p.name], p.total_units) for p in pools}
    for w in taken:
        start = max(w.start, now)
        profiles[w.pool].book(start, w.end - start, w.units)
    for h, _ in kept:
        start = max(h.start, now)
        profiles[h.pool].book(start, h.end - start, h.units)

    def crossing(names: Iterable[str], limit: float, account: str = "") -> tuple[str, ...]:
        """The windows and others' holds a start now would cross on ``names`` (it ends at now + limit)."""
        out = [w.words for name in names for w in of_pool.get(name, ()) if w.start < now + limit]
        out += [h.words for h, _ in kept if h.pool in names and account not in h.accounts and h.start < now + limit]
        return tuple(out)

    # In each pool's units: whole nodes on a node-exclusive pool, free GPUs on one that places
    # GPUs one by one (gateway/domain/plan_inputs.py domains(); its releases name no domains).
    doms = {p: Domains(now, levels, released[p], by_name[p].total_units)
            for p, levels in (domains or {}).items() if p in by_name}

    def when(c: Candidate, pool: str, prof: Profile, need: int) -> float:
        """The earliest start on ``prof`` (a pool's or a hold's), with the gang's domain rule."""
        limit = c.time_limit_s
        at = prof.earliest(need, limit)
        d = doms.get(pool)
        if at == INF or (d is None and not c.topology):
            return at
        if d is None or not d.futures:  # only now is known: wait at least for the pool's next release
            if c.topology and at <= now and (d is None or d.earliest(c.topology, need, limit, now) > now):
                at = prof.earliest(need, limit, after=now)
            return at
        while at < INF:  # the first moment both the pool (windows, holds) and one domain have room
            if at <= now:
                # A start now goes where the backend puts it: not onto a booked gang's domain.
                if d.fits_now(now, limit, need, c.topology):
                    return at
                at = prof.earliest(need, limit, after=now)
                continue
            if not c.topology:
                return at  # where a later start lands is the backend's choice then
            first = d.earliest(c.topology, need, limit, at)
            if first in (at, INF):
                return first
            at = prof.earliest(need, limit, not_before=first)
        return at

    planned_ahead = bool(of_pool or kept)  # only then can a start now cross anything
    out = Plan()
    for c in candidates:
        if max_examined is not None and out.examined >= max_examined:
            break
        if max_starts is not None and len(out.starts) >= max_starts:
            break
        out.examined += 1
        if c.blocked:
            out.unplanned[c.id] = c.blocked
            continue
        # (start, 0 in one of its account's holds / 1 on the open capacity, rank, pool, units,
        # profile, hold): the earliest start wins; at the same time its holds come first.
        best: tuple[float, int, int, str, int, Profile, str] | None = None
        if c.account:
            for h, prof in kept:
                if c.account not in h.accounts or h.pool not in c.pools:
                    continue
                need = by_name[h.pool].units(c.workers, c.gpus_per_worker)
                at = when(c, h.pool, prof, need)
                rank = c.pools.index(h.pool)
                if at < INF and (best is None or (at, rank) < (best[0], best[2])):
                    best = (at, 0, rank, h.pool, need, prof, h.id)
        for rank, name in enumerate(c.pools):
            pool = by_name.get(name)
            if pool is None:
                continue
            if best is not None and best[0] == now:
                break  # nothing starts earlier than now
            need = pool.units(c.workers, c.gpus_per_worker)
            at = when(c, name, profiles[name], need)
            if at < INF and (best is None or (at, 1, rank) < best[:3]):
                best = (at, 1, rank, name, need, profiles[name], "")
        if best is None:
            out.unplanned[c.id] = "no pool it may use will have room (capacity is held with no known end)"
            if planned_ahead:
                out.crossing[c.id] = crossing(c.pools, c.time_limit_s, c.account)
            if policy == "fifo":
                break
            continue
        at, _, _, name, need, prof, hold = best
        if at <= now:
            prof.book(now, c.time_limit_s, need)
            if name in doms:
                doms[name].book(now, c.time_limit_s, need, c.topology, now=True)
            where = f" in hold {hold}" if hold else ""
            out.starts.append(Placement(c.id, name, now, False, f"starts now on {name}{where}", hold=hold))
            continue
        crossed = crossing((name,), c.time_limit_s, c.account) if planned_ahead and not hold else ()
        if crossed:
            out.crossing[c.id] = crossed
        if policy == "fifo":
            out.unplanned[c.id] = "first in line; waits for room (strict FIFO)"
            break
        if len(out.reservations) < depth:
            prof.book(at, c.time_limit_s, need)
            if c.topology and name in doms:  # the others may start on any nodes then: the pool's profile holds them
                doms[name].book(at, c.time_limit_s, need, c.topology)
            out.reservations.append(Placement(c.id, name, at, True, f"reserved on {name} " + (
                f"in hold {hold}" if hold else "from its planned start"), crossed, hold))
        else:
            out.unplanned[c.id] = f"behind the {depth} jobs that hold reservations; no estimate yet"
        if policy == "greedy" or len(out.reservations) >= depth:
            # Nothing more can be reserved: later jobs only matter if they fit now (in a hold too).
            if all(profiles[p.name].free_now() == 0 for p in pools) and all(
                    held.free_now() <= 0 for _, held in kept):
                break
    return out
