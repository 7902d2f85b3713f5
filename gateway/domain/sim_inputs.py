"""What the scheduling simulator (simulate.py) replays: the pools, the trace's jobs, the policy
and how the ``borrow`` policy reclaims; and which jobs of a trace ask within their guarantee.

simulate.py's docstring says what each policy does with them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
from collections.abc import Mapping, Sequence

from adapters.base import features_of
from gateway.domain.planner import PoolModel

GREEDY, RESERVATION, FIFO, HARD_CAPS, BORROW = "greedy", "reservation", "fifo", "hard-caps", "borrow"
POLICIES = (GREEDY, RESERVATION, FIFO, HARD_CAPS, BORROW)


@dataclasses.dataclass(frozen=True)
class SimPool:
    name: str
    kind: str  # "slurm" or "kubernetes": its adapter says whether it counts whole nodes
    nodes: int
    gpus_per_node: int
    storages: frozenset[str] = frozenset()  # the storages it provides (docs/storage.md)
    blocks: tuple[int, ...] = ()  # nodes of each network block (level "block"), node-exclusive pools only

    @functools.cached_property  # asked in every simulated round; a frozen pool's kind never changes
    def node_exclusive(self) -> bool:
        return features_of(self.kind).node_exclusive

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def model(self) -> PoolModel:
        units = self.nodes if self.node_exclusive else self.gpus
        return PoolModel(self.name, self.node_exclusive, units, self.gpus_per_node)

    def gpus_of(self, units: int) -> int:
        """The GPUs ``units`` of this pool hold (whole nodes on a node-exclusive pool)."""
        return units * self.gpus_per_node if self.node_exclusive else units


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
    topology: str = ""  # a level of which one domain must hold the whole gang ("block"; "": any nodes)

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker


@dataclasses.dataclass(frozen=True)
class Reclaim:
    """How the ``borrow`` policy stops borrowed work (simulate.py's docstring, "Checkpoints")."""

    grace_s: float = 120.0  # from the signal to the stop
    min_runtime_s: float = 600.0  # ISTHMUS_PREEMPT_MIN_RUNTIME_S
    max_per_pool_per_minute: int = 4
    checkpoint_every_s: float | None = 1800.0  # None: jobs never checkpoint
    reports: bool = True  # the victim choice sees the checkpoints
    max_asks_per_round: int = 8  # victim choices asked per round (a bounded round)



def within_guarantee(trace: Sequence[TraceJob], guarantees: Mapping[str, int]) -> set[str]:
    """The jobs submitted within their account's guarantee, a property of the trace alone.

    A job is in when its account's jobs that would be running at its arrival, had every job
    started on arrival, hold with it at most the guarantee in GPUs. The same set for every
    policy, so their waits compare like for like.
    """
    out: set[str] = set()
    by_account: dict[str, list[TraceJob]] = collections.defaultdict(list)
    for j in trace:
        by_account[j.account].append(j)
    for account, jobs in by_account.items():
        cap = guarantees.get(account, 0)
        ends: list[tuple[float, int]] = []
        demand = 0
        for j in sorted(jobs, key=lambda j: (j.arrival, j.id)):
            while ends and ends[0][0] <= j.arrival:
                demand -= heapq.heappop(ends)[1]
            if demand + j.total_gpus <= cap:
                out.add(j.id)
            demand += j.total_gpus
            heapq.heappush(ends, (j.arrival + j.run_s, j.total_gpus))
    return out
