"""What the scheduling simulator (simulate.py) reports: each job's outcome, and the run's
measures (utilisation, waits, lost work, fairness, holds honoured, topology violations)."""

from __future__ import annotations

import dataclasses

from gateway.domain.sim_inputs import TraceJob


@dataclasses.dataclass
class JobOutcome:
    job: TraceJob
    pool: str | None = None
    start: float | None = None  # its first start
    end: float | None = None
    first_estimate: float | None = None  # the first planned start the planner gave it
    # The round at its arrival: its planned start (now if it started then); None: no estimate then.
    submit_estimate: float | None = None
    blocks: int = 0  # the network blocks its first start spread over (0: a pool without blocks)
    held_gpus: int = 0
    attempts: int = 0
    evictions: int = 0
    lost_gpu_s: float = 0.0  # work lost to evictions (since the last checkpoint), in GPU-seconds
    refused: str = ""  # why it was refused at submit
    # With a failure model (sim_failures.py): attempts ended by a node failure, those a flaky
    # node caused, the work they lost (since the last checkpoint), and whether the retry rule gave up.
    failures: int = 0
    flaky_failures: int = 0
    failed_gpu_s: float = 0.0
    gave_up: bool = False


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
    evictions: int = 0
    reclaim_starts: int = 0  # gangs started on room that evictions made
    lost_in_window_gpu_seconds: float = 0.0  # the part of the lost work done inside the window
    used_gpu_seconds: float = 0.0  # every attempt's GPU time, over the whole run
    spans: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)  # (start, end, GPU-s)
    # Every eviction: (signalled at, pool, victim, the gang it made room for, the rule's reason).
    eviction_log: list[tuple[float, str, str, str, str]] = dataclasses.field(default_factory=list)
    # hold id -> whether its units were free for its accounts at its start (nothing else held them)
    holds_honoured: dict[str, bool] = dataclasses.field(default_factory=dict)
    # hold id -> GPU-seconds its accounts' gangs ran inside it
    hold_used_gpu_s: dict[str, float] = dataclasses.field(default_factory=dict)
    # starts of gangs that require a domain with no domain of room for them (placed spread out)
    topology_violations: int = 0
    # With a failure model (sim_failures.py): every attempt on named nodes (job id, pool, nodes,
    # start, end, "node_failure" or "ended"), every quarantine (pool, node, from, to: the
    # horizon when still in it, flaky then or not), every failure (job id, pool, the node whose
    # failure ended the attempt, at), and the flaky nodes at the start.
    attempt_log: list[tuple[str, str, tuple[str, ...], float, float, str]] = dataclasses.field(default_factory=list)
    failure_log: list[tuple[str, str, str, float]] = dataclasses.field(default_factory=list)
    quarantine_log: list[tuple[str, str, float, float, bool]] = dataclasses.field(default_factory=list)
    flaky_nodes: tuple[tuple[str, str], ...] = ()

    @property
    def utilisation(self) -> float:
        """Busy GPU time over the window: every attempt's run counts, work later lost included."""
        span = self.window[1] - self.window[0]
        return self.busy_gpu_seconds / (self.total_gpus * span) if span > 0 else 0.0

    @property
    def net_utilisation(self) -> float:
        """Utilisation without the work that evictions threw away."""
        span = self.window[1] - self.window[0]
        kept = self.busy_gpu_seconds - self.lost_in_window_gpu_seconds
        return kept / (self.total_gpus * span) if span > 0 else 0.0

    def utilisation_in(self, lo: float, hi: float) -> float:
        """Busy GPU time over ``[lo, hi)``, as :attr:`utilisation` counts it over the window."""
        busy = 0.0
        for start, end, gpu_s in self.spans:
            a, b = max(start, lo), min(end, hi)
            if b > a and end > start:
                busy += gpu_s * (b - a) / (end - start)
        return busy / (self.total_gpus * (hi - lo)) if hi > lo else 0.0

    @property
    def lost_gpu_hours(self) -> float:
        return sum(o.lost_gpu_s for o in self.outcomes) / 3600

    @property
    def failed_gpu_hours(self) -> float:
        """Work lost to node failures (each failed attempt's since its last checkpoint)."""
        return sum(o.failed_gpu_s for o in self.outcomes) / 3600

    @property
    def failed_attempts(self) -> int:
        return sum(o.failures for o in self.outcomes)

    def waits(self, lo: int, hi: int) -> list[float]:
        return [o.start - o.job.arrival for o in self.outcomes
                if o.start is not None and lo <= o.job.total_gpus <= hi]

    def waits_of(self, ids: set[str], horizon: float) -> list[float]:
        """Waits of the jobs ``ids`` to their first start; one never started waits until the
        horizon, one refused at submit does not wait."""
        return [(o.start if o.start is not None else horizon) - o.job.arrival
                for o in self.outcomes if o.job.id in ids and not o.refused]

    def longest_gang_wait(self, horizon: float) -> float:
        """Longest wait of any multi-worker gang; one never started waits until the horizon."""
        worst = 0.0
        for o in self.outcomes:
            if o.job.workers < 2 or o.refused:
                continue
            worst = max(worst, (o.start if o.start is not None else horizon) - o.job.arrival)
        return worst

    def unstarted_gangs(self) -> int:
        return sum(1 for o in self.outcomes if o.job.workers >= 2 and o.start is None)

    def refused_gangs(self) -> int:
        return sum(1 for o in self.outcomes if o.job.workers >= 2 and o.refused)

    def jain(self, leave_out: frozenset[str] = frozenset()) -> float:
        """Jain's fairness index of usage per share over accounts (1.0 = usage in proportion),
        without the accounts ``leave_out`` (one that submitted nothing has no claim to its share)."""
        xs = [self.usage_by_account.get(a, 0.0) / s for a, s in self.shares.items() if s > 0 and a not in leave_out]
        sq = sum(x * x for x in xs)
        return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0
