"""A virtual-clock replay of a job trace through the gateway's own scheduling code.

The planner (``planner.plan``) decides every start, exactly as in the dispatcher, and the
ledger's pure fair-share function (``gateway.domain.fairshare.compute_fairshare``) orders
the accounts from decayed usage. Pools are simulated: a gang holds its whole allocation
from start to end (Slurm's exclusive nodes, Kueue's admission as a unit), so a partially
started gang cannot happen here, and the report measures it to say so.

Used by ``bench/simulate.py`` (the policy table in docs/benchmarks.md) and by the tests.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from collections.abc import Iterator, Mapping, Sequence

from gateway.domain.fairshare import compute_fairshare
from gateway.domain.planner import Candidate, PoolModel, Release, plan


@dataclasses.dataclass(frozen=True)
class SimPool:
    name: str
    kind: str  # "slurm" (whole nodes) or "kubernetes" (GPUs)
    nodes: int
    gpus_per_node: int
    storages: frozenset[str] = frozenset()  # the storages it provides (docs/storage.md)

    @property
    def node_exclusive(self) -> bool:
        return self.kind == "slurm"

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def model(self) -> PoolModel:
        units = self.nodes if self.node_exclusive else self.gpus
        return PoolModel(self.name, self.node_exclusive, units, self.gpus_per_node)


@dataclasses.dataclass(frozen=True)
class TraceJob:
    id: str
    arrival: float
    account: str
    workers: int
    gpus_per_worker: int
    run_s: float
    time_limit_s: float
    kinds: tuple[str, ...] = ("slurm", "kubernetes")  # pool kinds it may use
    storages: frozenset[str] = frozenset()  # only pools that provide all of these (its mounts)

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker


@dataclasses.dataclass
class JobOutcome:
    job: TraceJob
    pool: str | None = None
    start: float | None = None
    end: float | None = None
    first_estimate: float | None = None  # the first planned start the planner gave it
    held_gpus: int = 0


@dataclasses.dataclass
class SimResult:
    policy: str
    outcomes: list[JobOutcome]
    busy_gpu_seconds: float
    window: tuple[float, float]
    total_gpus: int
    usage_by_account: dict[str, float]
    shares: dict[str, int]
    rounds: int
    partial_gang_gpu_hours: float = 0.0

    @property
    def utilisation(self) -> float:
        span = self.window[1] - self.window[0]
        return self.busy_gpu_seconds / (self.total_gpus * span) if span > 0 else 0.0

    def waits(self, lo: int, hi: int) -> list[float]:
        return [o.start - o.job.arrival for o in self.outcomes
                if o.start is not None and lo <= o.job.total_gpus <= hi]

    def longest_gang_wait(self, horizon: float) -> float:
        """Longest wait of any multi-worker gang; one never started waits until the horizon."""
        worst = 0.0
        for o in self.outcomes:
            if o.job.workers < 2:
                continue
            worst = max(worst, (o.start if o.start is not None else horizon) - o.job.arrival)
        return worst

    def unstarted_gangs(self) -> int:
        return sum(1 for o in self.outcomes if o.job.workers >= 2 and o.start is None)

    def jain(self) -> float:
        """Jain's fairness index of usage per share over accounts (1.0 = usage in proportion)."""
        xs = [self.usage_by_account.get(a, 0.0) / s for a, s in self.shares.items() if s > 0]
        sq = sum(x * x for x in xs)
        return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


def simulate(trace: Sequence[TraceJob], pools: Sequence[SimPool], shares: Mapping[str, int], *,
             policy: str = "reservation", depth: int = 8, half_life_s: float = 7 * 86400,
             fairshare_every_s: float = 300, per_account: int = 32, max_examined: int = 2000,
             horizon: float | None = None, window: tuple[float, float] | None = None) -> SimResult:
    """Replay ``trace`` (sorted by arrival) and return what happened to every job.

    ``per_account`` bounds how many of one account's waiting jobs a round looks at (the
    gateway's look-past bound); ``horizon`` stops the clock (default: when all is done).
    """
    models = [p.model() for p in pools]
    by_name = {p.name: p for p in pools}
    tree = {a: (None, s) for a, s in shares.items()}
    outcomes = {j.id: JobOutcome(j) for j in trace}
    waiting: dict[str, collections.deque[TraceJob]] = collections.defaultdict(collections.deque)
    free = {m.name: m.total_units for m in models}
    running: dict[str, tuple[str, int, float]] = {}  # job id -> (pool, units, expected end)
    events: list[tuple[float, int, str, str]] = []
    seq = 0
    for j in trace:
        events.append((j.arrival, seq, "arrive", j.id))
        seq += 1
    heapq.heapify(events)
    # Decayed usage kept as of a fixed epoch t0: a charge at t adds gpu_s * 2^((t - t0) / h),
    # and the value at `now` is that sum times 2^(-(now - t0) / h). O(1) per charge.
    t0 = trace[0].arrival if trace else 0.0
    grown: dict[str, float] = collections.defaultdict(float)
    window_usage: dict[str, float] = collections.defaultdict(float)
    win = window or ((trace[0].arrival, trace[-1].arrival) if trace else (0.0, 0.0))
    busy = 0.0
    factors: dict[str, float] = {}
    factors_at = -math.inf
    rounds = 0
    decay = math.log(2) / half_life_s

    def charge(account: str, gpu_s: float, start: float, end: float, now: float) -> None:
        nonlocal busy
        grown[account] += gpu_s * math.exp(decay * (now - t0))
        lo, hi = max(start, win[0]), min(end, win[1])
        if hi > lo:
            part = gpu_s * (hi - lo) / (end - start) if end > start else 0.0
            busy += part
            window_usage[account] += part

    def refresh_factors(now: float) -> None:
        nonlocal factors, factors_at
        k = math.exp(-decay * (now - t0))
        own = {a: v * k for a, v in grown.items()}
        for jid, (pool, units, _end) in running.items():  # running usage so far, as accrual does
            o = outcomes[jid]
            own[o.job.account] = own.get(o.job.account, 0.0) + o.held_gpus * (now - o.start)
        fs = compute_fairshare(tree, own)
        factors = {a: f.factor for a, f in fs.items()}
        factors_at = now

    eligible: dict[str, tuple[str, ...]] = {}
    for j in trace:  # never-fits, as routing applies it
        eligible[j.id] = tuple(p.name for p, m in zip(pools, models) if p.kind in j.kinds
                               and j.storages <= p.storages and j.gpus_per_worker <= p.gpus_per_node
                               and m.units(j.workers, j.gpus_per_worker) <= m.total_units)

    def candidates(now: float) -> Iterator[Candidate]:
        for account in sorted((a for a, q in waiting.items() if q), key=lambda a: (-factors.get(a, 0.0), a)):
            for n, j in enumerate(waiting[account]):
                if n >= per_account:
                    break
                names = eligible[j.id]
                yield Candidate(j.id, j.workers, j.gpus_per_worker, j.time_limit_s, names,
                                "" if names else "fits no pool")

    now = 0.0
    while events:
        now = events[0][0]
        if horizon is not None and now > horizon:
            break
        while events and events[0][0] == now:
            _, _, kind, jid = heapq.heappop(events)
            o = outcomes[jid]
            if kind == "arrive":
                waiting[o.job.account].append(o.job)
            else:  # end
                pool, units, _ = running.pop(jid)
                free[pool] += units
                o.end = now
                charge(o.job.account, o.held_gpus * (now - o.start), o.start, now, now)
        if now - factors_at >= fairshare_every_s:
            refresh_factors(now)
        rounds += 1
        releases = [Release(pool, units, end) for pool, units, end in running.values()]
        p = plan(now=now, pools=models, free_now=free, releases=releases, candidates=candidates(now),
                 depth=depth, policy=policy, max_examined=max_examined)
        for r in p.reservations:
            o = outcomes[r.job_id]
            if o.first_estimate is None:
                o.first_estimate = r.start
        for s in p.starts:
            o = outcomes[s.job_id]
            j = o.job
            pool = by_name[s.pool]
            units = pool.model().units(j.workers, j.gpus_per_worker)
            free[s.pool] -= units
            assert free[s.pool] >= 0, "the planner over-committed a pool"
            o.pool, o.start = s.pool, now
            o.held_gpus = units * pool.gpus_per_node if pool.node_exclusive else units
            if o.first_estimate is None:
                o.first_estimate = now
            running[j.id] = (s.pool, units, now + j.time_limit_s)
            waiting[j.account].remove(j)
            heapq.heappush(events, (now + min(j.run_s, j.time_limit_s), seq, "end", j.id))
            seq += 1
    end = horizon if horizon is not None else now
    for jid, (pool, units, _) in running.items():  # still running at the horizon
        o = outcomes[jid]
        charge(o.job.account, o.held_gpus * (end - o.start), o.start, end, end)
    return SimResult(policy=policy, outcomes=list(outcomes.values()), busy_gpu_seconds=busy,
                     window=win, total_gpus=sum(p.gpus for p in pools), usage_by_account=dict(window_usage),
                     shares=dict(shares), rounds=rounds)
