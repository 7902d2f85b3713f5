"""Reclaim: which borrowed gangs stop so that a gang within its guarantee can start (issue #30).

One rule, pure (numbers in, a decision out): the dispatcher and the scheduling simulator
(``gateway/domain/simulate.py``) both call :func:`choose_eviction`.

An account's work beyond its guaranteed GPUs may run on idle GPUs as *borrowed*; who is
borrowed is the ledger's decision, handed in as ``Running.borrowed``. When a gang of an
account within its guarantee fits nowhere, the caller asks for ONE eviction set across the
pools the gang may use:

* victims are borrowed gangs only, that have run at least the minimum runtime
  (``ISTHMUS_PREEMPT_MIN_RUNTIME_S``): nothing within a guarantee is ever stopped by this
  rule, and a gang is never stopped before it could make progress;
* in each pool, the cheapest first (:func:`choice_cost`: the GPU-hours since their last
  reported checkpoint; a gang that reported none, at most 30 minutes of them: silence is not
  protection) until
  the gang fits; then any victim the gang does not need is dropped again (the most expensive
  first), so no victim can be spared;
* a pool where that set would exceed its eviction budget (``max_per_pool_per_minute``
  evictions in any 60 s, those in ``recent`` included) is not used;
* across pools: the set that costs the least, then the fewest victims, then the
  pool's name (a deterministic answer for the same snapshot).

Fitting is counted as routing counts it: a node-exclusive pool (Slurm) needs ``workers`` idle
nodes and a victim gives back its whole ``nodes``; a packed pool (Kueue) needs
``workers * gpus_per_worker`` free GPUs and a victim gives back its ``gpus``.

The rule chooses the cheapest set greedily (the exact cheapest cover is a knapsack problem);
the set it returns is minimal, not always the cheapest of all minimal sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

RATE_WINDOW_S = 60.0
DEFAULT_MAX_PER_POOL_PER_MINUTE = 4

_NO_EVICTIONS: Mapping[str, Sequence[float]] = MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class Running:
    """A running gang that could be stopped."""

    id: str
    account: str
    pool: str
    gpus: int  # GPUs it holds
    nodes: int  # whole nodes it holds (node-exclusive pools), else 0
    borrowed: bool
    started_at: float  # epoch seconds when the whole gang started (this attempt)
    checkpoint_at: float | None = None  # its last reported committed checkpoint


@dataclasses.dataclass(frozen=True)
class Room:
    """One pool's free capacity now, as routing sees it."""

    pool: str
    node_exclusive: bool
    free_gpus: int
    idle_nodes: int


@dataclasses.dataclass(frozen=True)
class Eviction:
    """The gangs to stop on ``pool`` (empty when the gang fits there already)."""

    pool: str
    victims: tuple[Running, ...]
    gpu_hours_lost: float  # the victims' at-risk GPU-hours, summed
    reason: str  # words a user reads


def at_risk_gpu_hours(job: Running, now: float) -> float:
    """GPU-hours ``job`` loses if stopped at ``now``: its work since its last checkpoint.

    A checkpoint older than this attempt's start (one an earlier attempt wrote, which this
    attempt resumed from) protects nothing of this attempt; no report means all its run time
    is at risk.
    """
    since = job.started_at if job.checkpoint_at is None else max(job.started_at, job.checkpoint_at)
    return job.gpus * max(0.0, now - since) / 3600.0


# A gang that never reported a checkpoint is taken to have checkpointed at least this often.
UNREPORTED_AT_RISK_S = 1800.0


def choice_cost(job: Running, now: float) -> float:
    """What stopping ``job`` costs when victims are chosen: its GPU-hours since its last
    reported checkpoint of this attempt; with no report, at most UNREPORTED_AT_RISK_S of them.

    Silence is not protection (issue #45): if a job that never reports counted all its run
    time as at risk, a long silent job would look the most expensive to stop and the honest
    reporters would be stopped first. A job that reports nothing is taken to checkpoint every
    30 minutes, as a careful job does; a report can only show that it has less at risk. A young
    job before its first checkpoint is not penalised (its run time is below the bound). What a
    stopped job really loses is still :func:`at_risk_gpu_hours`, in its reason and events.
    """
    risk = at_risk_gpu_hours(job, now)
    if job.checkpoint_at is None or job.checkpoint_at < job.started_at:
        return min(risk, job.gpus * UNREPORTED_AT_RISK_S / 3600.0)
    return risk


def choose_eviction(*, workers: int, gpus_per_worker: int, pools: Mapping[str, Room], running: Sequence[Running],
                    now: float, min_runtime_s: float, recent: Mapping[str, Sequence[float]] = _NO_EVICTIONS,
                    max_per_pool_per_minute: int = DEFAULT_MAX_PER_POOL_PER_MINUTE,
                    preemptor: str = "") -> Eviction | None:
    """The one eviction set that lets a gang within its guarantee start (module docstring).

    Args:
        workers: the waiting gang's workers.
        gpus_per_worker: GPUs each worker needs.
        pools: the pools the gang may run on, by name (the caller has applied routing,
            storage and quota), with their free capacity now.
        running: running gangs (any; only borrowed ones in ``pools`` are candidates).
        now: the decision's time, on the clock of ``started_at`` and ``checkpoint_at``.
        min_runtime_s: a gang that has run less than this is never a victim.
        recent: per pool, the times of evictions already made (only the last 60 s count).
        max_per_pool_per_minute: evictions allowed per pool in any 60 s, this set included.
        preemptor: the waiting gang's account, for the reason.

    Returns:
        The eviction (``victims`` empty when the gang already fits on the chosen pool), or
        None when no pool can be made to fit within the rules.
    """
    by_pool: dict[str, list[Running]] = {name: [] for name in pools}
    for job in running:
        if job.borrowed and job.pool in by_pool and now - job.started_at >= min_runtime_s:
            by_pool[job.pool].append(job)
    best: tuple[tuple[float, int, str], Eviction] | None = None
    for name, room in pools.items():
        victims = _victims_in(room, by_pool[name], workers=workers, gpus_per_worker=gpus_per_worker, now=now)
        if victims is None:
            continue
        done = sum(1 for t in recent.get(name, ()) if 0 <= now - t < RATE_WINDOW_S)
        if victims and done + len(victims) > max_per_pool_per_minute:
            continue
        lost = sum(at_risk_gpu_hours(v, now) for v in victims)
        key = (sum(choice_cost(v, now) for v in victims), len(victims), name)
        if best is None or key < best[0]:
            best = (key, Eviction(name, victims, lost, ""))
    if best is None:
        return None
    chosen = best[1]
    reason = _reason(chosen, workers * gpus_per_worker, preemptor, now)
    return dataclasses.replace(chosen, reason=reason)


class ReclaimRound:
    """One round of reclaim asks: THE round rule, called by the dispatcher's round
    (``gateway/domain/decide.py``) and by the scheduling simulator (``simulate.py``) alike.

    The caller walks its waiting gangs in its own order and asks for each one's eviction set
    over the pools it may use (``rooms``: where it would run within its guarantee and does not
    fit now). The round keeps what the asks share:

    * the running gangs still to be had: a victim chosen for one gang is not offered to the
      next, and a gang's own account's jobs are never its victims;
    * the evictions of this round in each pool's rate budget (``recent``);
    * the shapes no eviction could place: victims only go and the budgets only fill during a
      round, so a (account, shape, rooms) that found no set will find none later in it;
    * at most ``max_asks`` calls of :func:`choose_eviction` (None: no limit).

    ``victims`` is called once, at the first ask that needs them (a round that asks nothing
    never builds the list).
    """

    def __init__(self, victims: Callable[[], Sequence[Running]], *, now: float, min_runtime_s: float,
                 max_per_pool_per_minute: int, recent: Mapping[str, Sequence[float]] = _NO_EVICTIONS,
                 max_asks: int | None = None):
        self._source = victims
        self._running: list[Running] | None = None
        self.now = now
        self.min_runtime_s = min_runtime_s
        self.max_per_pool_per_minute = max_per_pool_per_minute
        self.recent: dict[str, list[float]] = {pool: list(times) for pool, times in recent.items()}
        self.max_asks = max_asks
        self.asks = 0
        self._hopeless: set[tuple] = set()

    @property
    def exhausted(self) -> bool:
        return self.max_asks is not None and self.asks >= self.max_asks

    def ask(self, *, account: str, workers: int, gpus_per_worker: int, rooms: Mapping[str, Room]) -> Eviction | None:
        """The eviction set for one waiting gang of ``account``, taken out of the round's
        candidates; None when there is none (or nothing to stop, or no asks left)."""
        if not rooms or self.exhausted:
            return None
        key = (account, workers, gpus_per_worker, tuple(sorted(rooms.items())))
        if key in self._hopeless:
            return None
        if self._running is None:
            self._running = list(self._source())
        self.asks += 1
        eviction = choose_eviction(workers=workers, gpus_per_worker=gpus_per_worker, pools=rooms,
                                   running=[r for r in self._running if r.account != account], now=self.now,
                                   min_runtime_s=self.min_runtime_s, recent=self.recent,
                                   max_per_pool_per_minute=self.max_per_pool_per_minute, preemptor=account)
        if eviction is None or not eviction.victims:
            self._hopeless.add(key)
            return None
        stopped = {v.id for v in eviction.victims}
        self._running = [r for r in self._running if r.id not in stopped]
        self.recent.setdefault(eviction.pool, []).extend([self.now] * len(eviction.victims))
        return eviction


def _frees(room: Room, job: Running) -> int:
    return job.nodes if room.node_exclusive else job.gpus


def _victims_in(room: Room, candidates: list[Running], *, workers: int, gpus_per_worker: int,
                now: float) -> tuple[Running, ...] | None:
    """The minimal cheapest-first set that makes the gang fit ``room``; None if none does."""
    need = workers if room.node_exclusive else workers * gpus_per_worker
    have = room.idle_nodes if room.node_exclusive else room.free_gpus
    short = need - have
    if short <= 0:
        return ()
    # Cheapest first; at equal cost the youngest (it has had the least of its turn), then by id.
    order = sorted((c for c in candidates if _frees(room, c) > 0),
                   key=lambda c: (choice_cost(c, now), -c.started_at, c.id))
    taken: list[Running] = []
    freed = 0
    for c in order:
        if freed >= short:
            break
        taken.append(c)
        freed += _frees(room, c)
    if freed < short:
        return None
    # Never more than needed: drop what the gang can do without, the most expensive first.
    # One pass suffices: what is freed only shrinks, so a victim needed once stays needed.
    for c in sorted(taken, key=lambda c: (-choice_cost(c, now), c.started_at, c.id)):
        if freed - _frees(room, c) >= short:
            taken.remove(c)
            freed -= _frees(room, c)
    # In the order they were chosen: cheapest first.
    return tuple(sorted(taken, key=lambda c: (choice_cost(c, now), -c.started_at, c.id)))


def _hours(h: float) -> str:
    return f"{h:.1f} GPU-hours" if h >= 0.05 or h == 0 else f"{h:.2f} GPU-hours"


def _reason(ev: Eviction, gpus: int, preemptor: str, now: float) -> str:
    whose = f"{preemptor}'s gang" if preemptor else "a gang"
    head = f"to start {whose} ({gpus} GPUs) within its guarantee on {ev.pool}"
    if not ev.victims:
        return f"{head}: it fits there without stopping anything"
    owners = sorted({v.account for v in ev.victims})
    n = len(ev.victims)
    jobs = f"{n} borrowed job{'s' if n != 1 else ''} of {', '.join(owners)}"
    each = ", ".join(
        f"{v.id} ({_hours(at_risk_gpu_hours(v, now))} since "
        f"{'its last checkpoint' if v.checkpoint_at is not None and v.checkpoint_at > v.started_at else 'it started'})"
        for v in ev.victims)
    return f"{head}: stops {jobs}: {each}; {_hours(ev.gpu_hours_lost)} at risk in all"
