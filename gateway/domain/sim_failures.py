"""Flaky nodes in the scheduling simulator (issue #48, item 4): what node failures cost, with and
without the node-health rule (gateway/domain/nodehealth.py) keeping retries and gangs off them.

The failure model (:class:`FailureModel`), pure and seeded:

* **nodes**: every node of a node-exclusive pool (Slurm's whole-node allocation) has a name,
  ``n000`` ... A start takes the lowest-numbered idle nodes it may use, as Slurm's node order
  does with equal weights. Pools that place GPUs one by one (Kubernetes) have no named nodes
  and never fail here. Pools with network blocks are not supported with a failure model;
* **flaky nodes**: ``flaky_per_pool`` nodes of each node-exclusive pool, drawn from ``seed``
  (or named: ``flaky_nodes``). A gang running on a flaky node fails after an exponential
  time with mean ``flaky_mttf_s`` of run; on a healthy node with mean ``healthy_mttf_s``.
  A gang fails at the first of its nodes' failures (each node's own draw). The draws are
  common random numbers: a function of (seed, job, attempt, node), so the same attempt on
  the same node fails at the same time under every policy;
* **a failed attempt** (``node_failure``) is charged for its run like any attempt, loses its
  work since its last checkpoint (every ``checkpoint_every_s`` of run; None: its whole
  attempt), and is run again by the retry rule (gateway/domain/retry.py ``verdict``, at most
  ``max_attempts`` attempts, the gateway's default 3); it waits again in its original place
  in line and resumes from its checkpoint. When the rule gives up, the job ends failed;
* the record of a failure is the registry's: an ``AttemptEnd`` naming every node of the
  attempt and, in ``failed_nodes``, the node whose failure ended it, as the gateway records
  the node its backend had out of service at the failure (Slurm's DOWN node): the rule
  (``AttemptEnd.blamed``) blames that node alone. ``blame_gang``: the backend named no node
  (a Kubernetes node deleted with its pods), so the rule blames every node of the gang.

Policies (``policy``):

* ``none``: a retry may land anywhere; flaky nodes keep getting gangs;
* ``avoid``: a start of a job takes no node that ``nodehealth.avoided`` names for it (the
  nodes its own failures are blamed on, for ``avoid_s``); when too few others are idle it
  waits, as Slurm holds a job with ``--exclude`` pending. A round runs when each avoidance ends;
* ``quarantine``: ``avoid``, and after each failure ``nodehealth.verdicts`` (the
  ``thresholds``; default: infrastructure failures of 2 accounts within 1 h) judges the nodes
  it is blamed on; a suspect node is quarantined: no gang is placed on it and it leaves its pool's
  capacity for the planner, until the simulated admin clears it ``clear_after_s`` later
  (``cleared``: its earlier failures no longer count). ``repair_on_clear``: clearing mends a
  flaky node (default: it comes back as it was, the admin found nothing to replace).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from gateway.domain.nodehealth import AttemptEnd, Thresholds, avoided, verdicts
from gateway.domain.retry import NODE_FAILURE, RetryPolicy, verdict
from gateway.domain.sim_inputs import BORROW, RESERVATION, Reclaim, SimPool, TraceJob
from gateway.domain.sim_result import SimResult
from gateway.domain.simulate import _Replay

NONE, AVOID, QUARANTINE = "none", "avoid", "quarantine"
FAILURE_POLICIES = (NONE, AVOID, QUARANTINE)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # the trace's second 0, for the rule's datetimes
Node = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class FailureModel:
    """The failure model and the policy against it (module docstring)."""

    policy: str = NONE
    seed: int = 1
    flaky_per_pool: int = 2
    flaky_mttf_s: float = 4 * 3600.0  # mean run time to failure of a gang on a flaky node
    healthy_mttf_s: float | None = 250 * 86400.0  # on a healthy node (None: never fails)
    checkpoint_every_s: float | None = 1800.0  # None: a failure loses the whole attempt
    max_attempts: int = 3  # ISTHMUS_RETRY_MAX_ATTEMPTS' default
    thresholds: Thresholds = Thresholds()  # noqa: RUF009 (frozen)
    clear_after_s: float = 4 * 3600.0  # from quarantine to the admin's clear
    repair_on_clear: bool = False
    flaky_nodes: tuple[Node, ...] | None = None  # (pool, node name): instead of the seeded draw
    blame_gang: bool = False  # the backend does not say which node failed: the whole gang is blamed

    def __post_init__(self) -> None:
        if self.policy not in FAILURE_POLICIES:
            raise ValueError(f"unknown failure policy {self.policy!r}")


def node_name(i: int) -> str:
    return f"n{i:03d}"


def at(t: float) -> datetime:
    return EPOCH + timedelta(seconds=t)


class _FailingReplay(_Replay):
    def __init__(self, *args, failures: FailureModel, **kwargs):
        super().__init__(*args, **kwargs)
        if self.policy == BORROW:
            raise ValueError("a failure model with the borrow policy is not simulated")
        if any(p.blocks for p in self.pools):
            raise ValueError("a failure model with network blocks is not simulated")
        self.fm = failures
        self.retry = RetryPolicy(max_attempts=failures.max_attempts)
        named = [p for p in self.pools if p.node_exclusive]
        self.idle_nodes: dict[str, set[int]] = {p.name: set(range(p.nodes)) for p in named}
        if failures.flaky_nodes is not None:
            self.flaky = set(failures.flaky_nodes)
        else:
            rng = random.Random(f"flaky/{failures.seed}")
            self.flaky = {(p.name, node_name(i)) for p in named
                          for i in rng.sample(range(p.nodes), min(failures.flaky_per_pool, p.nodes))}
        self.flaky_at_start = tuple(sorted(self.flaky))
        self.on: dict[str, tuple[str, tuple[int, ...]]] = {}  # job id -> its attempt's pool and nodes
        self.cause: dict[str, Node] = {}  # job id -> the node whose failure ends its attempt
        self.failing: set[str] = set()
        self.ends: dict[str, list[AttemptEnd]] = collections.defaultdict(list)  # job id -> its failures
        self.by_node: dict[Node, list[AttemptEnd]] = collections.defaultdict(list)
        self.quarantined: dict[Node, float] = {}  # node -> since
        self.cleared: dict[Node, datetime] = {}
        self.attempt_log: list[tuple[str, str, tuple[str, ...], float, float, str]] = []
        self.failure_log: list[tuple[str, str, str, float]] = []
        self.quarantine_log: list[tuple[str, str, float, float, bool]] = []

    # Which nodes a start takes, and when its attempt fails.

    def _usable(self, j: TraceJob, pool: str, now: float) -> list[int]:
        idle = self.idle_nodes[pool]
        if self.fm.policy == NONE or not self.ends[j.id]:
            return sorted(idle)
        away = {n for p, n in avoided(self.ends[j.id], now=at(now), thresholds=self.fm.thresholds) if p == pool}
        return sorted(i for i in idle if node_name(i) not in away)

    def _placeable(self, j: TraceJob, pool: str, units: int, now: float) -> bool:
        return pool not in self.idle_nodes or len(self._usable(j, pool, now)) >= units

    def _draw(self, jid: str, attempt: int, node: Node) -> float:
        """Run time to this node's failure under this attempt (common random numbers)."""
        mttf = self.fm.flaky_mttf_s if node in self.flaky else self.fm.healthy_mttf_s
        if mttf is None:
            return math.inf
        key = f"{self.fm.seed}/{jid}/{attempt}/{node[0]}/{node[1]}".encode()
        u = (int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") + 0.5) / 2.0 ** 64
        return -math.log(u) * mttf

    def _start(self, j: TraceJob, pool_name: str, units: int, now: float, *, borrowed: bool) -> None:
        super()._start(j, pool_name, units, now, borrowed=borrowed)
        if pool_name not in self.idle_nodes:
            return
        nodes = tuple(self._usable(j, pool_name, now)[:units])
        assert len(nodes) == units, "a start without its nodes"
        self.idle_nodes[pool_name].difference_update(nodes)
        self.on[j.id] = (pool_name, nodes)
        o = self.outcomes[j.id]
        ttf, node = min((self._draw(j.id, o.attempts, (pool_name, node_name(i))), node_name(i)) for i in nodes)
        end_at = now + min(j.run_s - self.done_s[j.id], j.time_limit_s)
        if now + ttf < end_at:  # its end event no longer counts (end_seq)
            self.end_seq[j.id] = self._push(now + ttf, "fail", j.id)
            self.cause[j.id] = (pool_name, node)

    def _release(self, jid: str, now: float) -> None:
        start = self.started_at[jid]
        super()._release(jid, now)
        if jid in self.on:
            pool, nodes = self.on.pop(jid)
            self.idle_nodes[pool].update(nodes)
            self.attempt_log.append((jid, pool, tuple(node_name(i) for i in nodes), start, now,
                                     NODE_FAILURE if jid in self.failing else "ended"))

    # Failures, quarantine and clears.

    def _event(self, kind: str, jid: str, seq: int, now: float) -> None:
        if kind == "fail":
            if self.end_seq.get(jid) == seq:
                self._fail(jid, now)
        elif kind == "clear":
            self._clear(tuple(jid.split("\t")), now)
        else:
            super()._event(kind, jid, seq, now)

    def _fail(self, jid: str, now: float) -> None:
        o = self.outcomes[jid]
        j = o.job
        ran = now - self.started_at[jid]
        every = self.fm.checkpoint_every_s
        kept = math.floor(ran / every) * every if every else 0.0
        o.failed_gpu_s += o.held_gpus * (ran - kept)
        o.failures += 1
        cause = self.cause.pop(jid)
        o.flaky_failures += cause in self.flaky
        self.done_s[jid] += kept
        pool, nodes = self.on[jid]
        charged = o.held_gpus * ran
        self.failing.add(jid)
        self._release(jid, now)
        self.failing.discard(jid)
        self.failure_log.append((jid, pool, cause[1], now))
        end = AttemptEnd(jid, j.account, pool, tuple(node_name(i) for i in nodes), at(now), NODE_FAILURE,
                         int(charged), failed_nodes=() if self.fm.blame_gang else (cause[1],))
        self.ends[jid].append(end)
        for n in end.blamed:  # a node's verdict only counts the failures blamed on it
            self.by_node[(pool, n)].append(end)
        if self.fm.policy != NONE:
            self._push(now + self.fm.thresholds.avoid_s + 1.0, "tick", "")  # a round once the avoidance ended
        if self.fm.policy == QUARANTINE:
            self._judge(end, now)
        if verdict(self.retry, attempt=o.failures, failure=NODE_FAILURE, exit_code=None) is None:
            o.end, o.gave_up = now, True
            return
        queue = self.waiting[j.account]
        i = 0  # its place in line: by its first submit
        while i < len(queue) and (queue[i].arrival, queue[i].id) < (j.arrival, j.id):
            i += 1
        queue.insert(i, j)

    def _judge(self, end: AttemptEnd, now: float) -> None:
        """The rule's verdict on the nodes the failure is blamed on (only theirs can have changed)."""
        keys = [(end.pool, n) for n in end.blamed if (end.pool, n) not in self.quarantined]
        ends = list({id(e): e for key in keys for e in self.by_node[key]}.values())
        judged = verdicts(ends, now=at(now), thresholds=self.fm.thresholds, cleared=self.cleared)
        for key in keys:
            if judged[key].suspect:
                self._quarantine(key, now)

    def _resize(self, pool: str, by: int) -> None:
        """The pool's capacity for the planner, and its free nodes, change by ``by`` nodes."""
        i = next(k for k, m in enumerate(self.models) if m.name == pool)
        m = dataclasses.replace(self.models[i], total_units=self.models[i].total_units + by)
        self.models[i] = self.model_of[pool] = m
        self.free[pool] += by
        assert self.free[pool] == len(self.idle_nodes[pool]), "free nodes out of step with the named ones"

    def _quarantine(self, key: Node, now: float) -> None:
        pool, name = key
        i = int(name[1:])
        assert i in self.idle_nodes[pool], "a node quarantined under a gang"
        self.idle_nodes[pool].discard(i)
        self._resize(pool, -1)
        self.quarantined[key] = now
        self._push(now + self.fm.clear_after_s, "clear", f"{pool}\t{name}")

    def _clear(self, key: Node, now: float) -> None:
        since = self.quarantined.pop(key)
        self.quarantine_log.append((key[0], key[1], since, now, key in self.flaky))
        self.cleared[key] = at(now)
        self.idle_nodes[key[0]].add(int(key[1][1:]))
        self._resize(key[0], +1)
        if self.fm.repair_on_clear:
            self.flaky.discard(key)

    def run(self) -> SimResult:
        res = super().run()
        end = self.horizon if self.horizon is not None else math.inf
        res.attempt_log = self.attempt_log
        res.failure_log = self.failure_log
        res.quarantine_log = self.quarantine_log + [(p, n, since, end, (p, n) in self.flaky)
                                                    for (p, n), since in sorted(self.quarantined.items())]
        res.flaky_nodes = self.flaky_at_start
        return res


def simulate_failures(trace: Sequence[TraceJob], pools: Sequence[SimPool], shares: Mapping[str, int],
                      failures: FailureModel = FailureModel(), *,
                      policy: str = RESERVATION, depth: int = 8, half_life_s: float = 7 * 86400,
                      fairshare_every_s: float = 300, per_account: int = 32, max_examined: int = 2000,
                      horizon: float | None = None, window: tuple[float, float] | None = None,
                      guarantees: Mapping[str, int] | None = None) -> SimResult:
    """``simulate.simulate`` with node failures: the same replay, the same defaults."""
    return _FailingReplay(trace, pools, shares, policy=policy, depth=depth, half_life_s=half_life_s,
                          fairshare_every_s=fairshare_every_s, per_account=per_account,
                          max_examined=max_examined, horizon=horizon, window=window, guarantees=guarantees,
                          reclaim=Reclaim(), failures=failures).run()
