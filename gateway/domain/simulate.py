"""A virtual-clock replay of a job trace through the gateway's own scheduling code.

The planner (``planner.plan``) decides every start, exactly as in the dispatcher, and the
ledger's pure fair-share function (``gateway.domain.fairshare.compute_fairshare``) orders
the accounts from decayed usage. Pools are simulated: a gang holds its whole allocation
from start to end (Slurm's exclusive nodes, Kueue's admission as a unit), so a partially
started gang cannot happen here, and the report measures it to say so.

Policies: ``greedy``, ``reservation`` and ``fifo`` are the planner's own. Two more take
per-account guaranteed GPUs (issue #30):

* ``hard-caps``: the reservation policy with each account capped at its guarantee (what a
  site gets today by setting ``max_gpus`` to it). A job larger than its account's cap is
  refused at submit, as admission refuses one larger than ``max_gpus``; a job that would
  take its account over the cap waits, looked past by the planner like any quota refusal.
* ``borrow`` ("guarantees + borrowing + reclaim"): the reservation policy with no cap. A job
  is *borrowed* when, at its start, its account's GPUs (running, and held for gangs about to
  start by reclaim) including it exceed the guarantee; it stays so for that attempt. After
  each round, a waiting job whose account has room in its guarantee for it, and which the
  plan does not start within the grace period, asks the one victim rule
  (``gateway.domain.preempt.choose_eviction``) for borrowed gangs to stop. The victims are
  signalled and stop ``grace_s`` later; the gang starts then on the room they leave, which
  is held for it meanwhile. A victim loses its work since its last checkpoint, is charged
  for its run like any attempt, and waits again in its original place in line (its first
  submit time); its next attempt resumes from that checkpoint (no restart overhead).

Checkpoints (:class:`Reclaim`): every job commits a checkpoint every ``checkpoint_every_s``
of its own run (None: never). With ``reports`` the victim choice sees them; without, it
takes all of a victim's run time as at risk. Either way a victim really loses only its work
since its last checkpoint; a job that never checkpoints loses its whole attempt. No job
checkpoints on the grace signal here (a job that does would lose less).

Windows (``outages``, docs/planning.md): maintenances and reservations in the trace's
clock, passed to every round's plan as the dispatcher passes them; a round also runs at each
window's start and end. Advance reservations (``holds``) too: a gang the plan starts in a hold
is counted in it while it runs, and each hold's start checks that its units were free then
(``SimResult.holds_honoured``).

Topology (docs/planning.md, "Topology"): a pool may have network blocks (``SimPool.blocks``,
level ``block``) and a job may require one (``TraceJob.topology``). The replay keeps each
block's idle nodes, gives them to every round's plan (``domains``), and places every start as
the backend does, by the planner's own rule (``pick_domains``: best fit, else spread). A
gang that requires a block and finds none with room at its start is placed anyway and
counted (``SimResult.topology_violations``: the planner's rule says it never happens). With
``domain_futures`` each running gang's release names the blocks its nodes free, so the
planner knows which block frees when; without, releases are the pool's alone (the fallback).

Node failures (issue #48): ``sim_failures.py`` replays a trace with flaky nodes through a
subclass of this replay, which names each gang's nodes, fails attempts and keeps retries off
nodes through the two hooks below (``_placeable``, ``_event``); without it nothing fails.

The replay is this module's; what it is given (pools, trace jobs, policies, ``Reclaim``) is in
``sim_inputs.py``, what it reports (``JobOutcome``, ``SimResult``) in ``sim_result.py``, and
its books (charges, decayed usage, fair-share factors) in ``sim_ledger.py``.

Used by ``bench/simulate.py`` (the policy table in docs/benchmarks.md), by
``bench/simulate_windows.py`` (windows) and by the tests.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from collections.abc import Iterator, Mapping, Sequence

from gateway.domain.planner import (
    INF,
    Candidate,
    Hold,
    Outage,
    Release,
    pick_domains,
    plan,
)
from gateway.domain.preempt import RATE_WINDOW_S, ReclaimRound, Room, Running
from gateway.domain.sim_inputs import (
    BORROW,
    HARD_CAPS,
    POLICIES,
    RESERVATION,
    Reclaim,
    SimPool,
    TraceJob,
)
from gateway.domain.sim_ledger import SimLedger
from gateway.domain.sim_result import JobOutcome, SimResult


@dataclasses.dataclass
class _Pending:
    """A gang that evictions make room for: it starts when its victims have stopped."""

    pool: str
    need: int  # units
    held: int  # units already set aside for it
    start_at: float
    victims: list[str]


class _Replay:
    def __init__(self, trace: Sequence[TraceJob], pools: Sequence[SimPool], shares: Mapping[str, int], *,
                 policy: str, depth: int, half_life_s: float, fairshare_every_s: float, per_account: int,
                 max_examined: int, horizon: float | None, window: tuple[float, float] | None,
                 guarantees: Mapping[str, int] | None, reclaim: Reclaim, outages: Sequence[Outage] = (),
                 holds: Sequence[Hold] = (), domain_futures: bool = True):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        if policy in (HARD_CAPS, BORROW) and guarantees is None:
            raise ValueError(f"policy {policy!r} needs guarantees")
        self.trace, self.policy, self.depth = trace, policy, depth
        self.plan_policy = RESERVATION if policy in (HARD_CAPS, BORROW) else policy
        self.guarantees = dict(guarantees or {})
        self.reclaim = reclaim
        self.fairshare_every_s, self.per_account, self.max_examined = fairshare_every_s, per_account, max_examined
        self.horizon = horizon
        self.pools = list(pools)
        self.models = [p.model() for p in pools]
        self.by_name = {p.name: p for p in pools}
        self.model_of = {m.name: m for m in self.models}
        self.shares = dict(shares)
        self.outcomes = {j.id: JobOutcome(j) for j in trace}
        self.waiting: dict[str, collections.deque[TraceJob]] = collections.defaultdict(collections.deque)
        self.free = {m.name: m.total_units for m in self.models}
        # pool -> level -> block -> idle nodes; job id -> (level, block, nodes) it holds
        self.idle = {p.name: {"block": {f"b{i}": n for i, n in enumerate(p.blocks)}}
                     for p in pools if p.blocks and p.node_exclusive}
        self.placed: dict[str, tuple[tuple[str, str, int], ...]] = {}
        self.domain_futures = domain_futures
        self.topology_violations = 0
        self.running: dict[str, tuple[str, int, float]] = {}  # job id -> (pool, units, expected end)
        self.started_at: dict[str, float] = {}  # job id -> this attempt's start
        self.done_s: dict[str, float] = collections.defaultdict(float)  # committed work (checkpoints)
        self.borrowed: set[str] = set()
        self.held: dict[str, int] = collections.defaultdict(int)  # account -> GPUs running
        self.pending_gpus: dict[str, int] = collections.defaultdict(int)  # account -> GPUs held for reclaims
        self.pending: dict[str, _Pending] = {}
        self.stopping: dict[str, str] = {}  # victim -> the gang its stop makes room for
        self.end_seq: dict[str, int] = {}  # job id -> the end event of its current attempt
        self.recent: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.evictions = 0
        self.reclaim_starts = 0
        self.lost_in_window = 0.0
        self.eviction_log: list[tuple[float, str, str, str, str]] = []
        self.events: list[tuple[float, int, str, str]] = []
        self.seq = 0
        for j in trace:
            self._push(j.arrival, "arrive", j.id)
        self.outages = list(outages)
        self.holds = list(holds)
        self.in_hold: dict[str, str] = {}  # job id -> the hold it runs in
        self.holds_honoured: dict[str, bool] = {}
        self.hold_used: dict[str, float] = collections.defaultdict(float)
        for w in [*self.outages, *self.holds]:  # a round when a window or hold starts and when it ends
            for at in (w.start, w.end):
                if at < INF:
                    self._push(at, "tick", "")
        self.win = window or ((trace[0].arrival, trace[-1].arrival) if trace else (0.0, 0.0))
        self.books = SimLedger(shares, t0=trace[0].arrival if trace else 0.0, window=self.win,
                               half_life_s=half_life_s)  # charges and fair share
        self.rounds = 0
        self.eligible: dict[str, tuple[str, ...]] = {}
        self.gpus_on: dict[str, dict[str, int]] = {}  # job id -> pool -> GPUs it would hold there
        for j in trace:  # never-fits, as routing applies it
            names = tuple(p.name for p, m in zip(pools, self.models, strict=True) if p.kind in j.kinds
                          and j.storages <= p.storages and j.gpus_per_worker <= p.gpus_per_node
                          and m.units(j.workers, j.gpus_per_worker) <= m.total_units
                          and (not j.topology or (j.topology == "block" and p.node_exclusive
                                                  and max(p.blocks, default=0) >= j.workers)))
            self.eligible[j.id] = names
            self.gpus_on[j.id] = {n: self.by_name[n].gpus_of(self.model_of[n].units(j.workers, j.gpus_per_worker))
                                  for n in names}

    # The clock and the books.

    def _push(self, at: float, kind: str, jid: str) -> int:
        heapq.heappush(self.events, (at, self.seq, kind, jid))
        self.seq += 1
        return self.seq - 1

    def _refresh_factors(self, now: float) -> None:
        running = ((self.outcomes[jid].job.account, self.outcomes[jid].held_gpus * (now - self.started_at[jid]))
                   for jid in self.running)  # running usage so far, as accrual does
        self.books.refresh_factors(now, running)

    def _load(self, account: str) -> int:
        """GPUs the account holds now: running, and set aside for its gangs about to start."""
        return self.held[account] + self.pending_gpus[account]

    def _order(self) -> list[str]:
        return sorted((a for a, q in self.waiting.items() if q), key=lambda a: (-self.books.factors.get(a, 0.0), a))

    def _candidates(self) -> Iterator[Candidate]:
        capped = self.policy == HARD_CAPS
        for account in self._order():
            room = self.guarantees.get(account, 0) - self._load(account) if capped else 0
            for n, j in enumerate(self.waiting[account]):
                if n >= self.per_account:
                    break
                names = self.eligible[j.id]
                blocked = "" if names else "fits no pool"
                if capped and names:
                    names = tuple(p for p in names if self.gpus_on[j.id][p] <= room)
                    blocked = "" if names else "quota: over its account's cap"
                yield Candidate(j.id, j.workers, j.gpus_per_worker, j.time_limit_s, names, blocked, j.account,
                                j.topology)

    # Starts and stops.

    def _start(self, j: TraceJob, pool_name: str, units: int, now: float, *, borrowed: bool) -> None:
        """Start an attempt on ``units`` already taken from the pool."""
        o = self.outcomes[j.id]
        pool = self.by_name[pool_name]
        o.pool = pool_name
        if o.start is None:
            o.start = now
        if o.first_estimate is None:
            o.first_estimate = now
        o.held_gpus = pool.gpus_of(units)
        o.attempts += 1
        self.running[j.id] = (pool_name, units, now + j.time_limit_s)
        if pool_name in self.idle:
            self._place(j, pool_name, units)
        self.started_at[j.id] = now
        self.held[j.account] += o.held_gpus
        if borrowed:
            self.borrowed.add(j.id)
        left = j.run_s - self.done_s[j.id]
        self.end_seq[j.id] = self._push(now + min(left, j.time_limit_s), "end", j.id)

    def _place(self, j: TraceJob, pool: str, units: int) -> None:
        """Put a start on nodes of the pool's blocks, as the backend would (the planner's rule)."""
        idle = self.idle[pool]
        picks = pick_domains(idle, units, j.topology)
        if j.topology and not any(level == j.topology and n == units for level, _, n in picks):
            self.topology_violations += 1  # no block had room: spread, and counted
            picks = pick_domains(idle, units)
        for level, name, n in picks:
            idle[level][name] -= n
            assert idle[level][name] >= 0, "a block over-committed"
        self.placed[j.id] = tuple(picks)
        o = self.outcomes[j.id]
        if not o.blocks:
            o.blocks = len({name for level, name, _ in picks if level == "block"})

    def _release(self, jid: str, now: float) -> None:
        """The attempt of ``jid`` stops now: its units go back (or to the gang its stop is for)."""
        o = self.outcomes[jid]
        hid = self.in_hold.pop(jid, None)
        if hid is not None:
            self.hold_used[hid] += o.held_gpus * (now - self.started_at[jid])
        pool, units, _ = self.running.pop(jid)
        for level, name, n in self.placed.pop(jid, ()):
            self.idle[pool][level][name] += n
        start = self.started_at.pop(jid)
        self.borrowed.discard(jid)
        self.end_seq.pop(jid, None)
        self.held[o.job.account] -= o.held_gpus
        self.books.charge(o.job.account, o.held_gpus * (now - start), start, now, now)
        gid = self.stopping.pop(jid, None)
        if gid is None:
            self.free[pool] += units
            return
        pend = self.pending[gid]
        take = min(units, pend.need - pend.held)
        pend.held += take
        pend.victims.remove(jid)
        self.free[pool] += units - take

    def _stop(self, jid: str, now: float) -> None:
        """A victim's grace period is over: it loses its work since its last checkpoint and waits again."""
        if jid not in self.stopping:  # it ended on its own during the grace period
            return
        o = self.outcomes[jid]
        ran = now - self.started_at[jid]
        every = self.reclaim.checkpoint_every_s
        kept = math.floor(ran / every) * every if every else 0.0
        o.lost_gpu_s += o.held_gpus * (ran - kept)
        lo, hi = max(now - (ran - kept), self.win[0]), min(now, self.win[1])
        if hi > lo:
            self.lost_in_window += o.held_gpus * (hi - lo)
        o.evictions += 1
        self.done_s[jid] += kept
        self._release(jid, now)
        queue = self.waiting[o.job.account]
        i = 0  # its place in line: by its first submit
        while i < len(queue) and (queue[i].arrival, queue[i].id) < (o.job.arrival, o.job.id):
            i += 1
        queue.insert(i, o.job)

    def _start_reclaimed(self, gid: str, now: float) -> None:
        pend = self.pending.pop(gid)
        assert pend.held == pend.need and not pend.victims, "a reclaimed gang started without its room"
        j = self.outcomes[gid].job
        self.pending_gpus[j.account] -= self.gpus_on[gid][pend.pool]
        self._start(j, pend.pool, pend.need, now, borrowed=False)
        self.reclaim_starts += 1

    def _holds_now(self) -> list[Hold]:
        """The holds with the gangs running in them (their expected ends are their releases' times)."""
        return [dataclasses.replace(h, in_use=tuple((self.running[jid][2], self.running[jid][1])
                                                    for jid, hid in self.in_hold.items() if hid == h.id))
                for h in self.holds]

    def _check_holds(self, now: float) -> None:
        """At a hold's start: were its units free of everyone else's gangs (its own may be in it)?"""
        for h in self.holds:
            if h.start != now or h.id in self.holds_honoured:
                continue
            total = self.model_of[h.pool].total_units
            others = sum(units for jid, (pool, units, _) in self.running.items()
                         if pool == h.pool and self.in_hold.get(jid) != h.id)
            self.holds_honoured[h.id] = others <= total - h.units

    def _releases(self) -> list[Release]:
        out = [Release(pool, units, end, self.placed.get(jid, ()) if self.domain_futures else ())
               for jid, (pool, units, end) in self.running.items() if jid not in self.stopping]
        for gid, pend in self.pending.items():
            # The victims' units go to the gang at its start, the rest back to the pool then.
            coming = pend.held + sum(self.running[v][1] for v in pend.victims)
            if coming > pend.need:
                out.append(Release(pend.pool, coming - pend.need, pend.start_at))
            out.append(Release(pend.pool, pend.need, pend.start_at + self.outcomes[gid].job.time_limit_s))
        return out

    # Reclaim.

    def _room(self, name: str) -> Room:
        pool = self.by_name[name]
        free = self.free[name]
        return Room(name, pool.node_exclusive, pool.gpus_of(free), free if pool.node_exclusive else 0)

    def _victims_now(self, now: float) -> list[Running]:
        every = self.reclaim.checkpoint_every_s
        out = []
        for jid in self.borrowed:
            if jid in self.stopping:
                continue
            o = self.outcomes[jid]
            pool, units, _ = self.running[jid]
            start = self.started_at[jid]
            ckpt = None
            if self.reclaim.reports and every and now - start >= every:
                ckpt = start + math.floor((now - start) / every) * every
            out.append(Running(jid, o.job.account, pool, o.held_gpus,
                               units if self.by_name[pool].node_exclusive else 0, True, start, ckpt))
        return out

    def _reclaim_round(self, now: float, planned_at: Mapping[str, float]) -> None:
        """The waiting gangs within their guarantee ask the round rule (``preempt.ReclaimRound``,
        the dispatcher's own) for victims: accounts in fair-share order, each's first
        ``per_account`` gangs, at most ``max_asks_per_round`` asks."""
        r = self.reclaim
        asks = ReclaimRound(lambda: self._victims_now(now), now=now, min_runtime_s=r.min_runtime_s,
                            max_per_pool_per_minute=r.max_per_pool_per_minute, recent=self.recent,
                            max_asks=r.max_asks_per_round)
        for account in self._order():
            room = self.guarantees.get(account, 0) - self._load(account)
            if room <= 0:
                continue
            for n, j in enumerate(list(self.waiting[account])):
                if n >= self.per_account:
                    break
                names = tuple(p for p in self.eligible[j.id] if self.gpus_on[j.id][p] <= room)
                if not names or planned_at.get(j.id, INF) <= now + r.grace_s:
                    continue  # beyond its guarantee, or the plan starts it as soon as a stop would
                # Where it fits now the plan holds the room for a higher job's reservation.
                names = tuple(p for p in names if self.model_of[p].units(j.workers, j.gpus_per_worker)
                              > self.free[p])
                ev = asks.ask(account=account, workers=j.workers, gpus_per_worker=j.gpus_per_worker,
                              rooms={p: self._room(p) for p in names})
                if ev is not None:
                    self._evict(j, ev.pool, [v.id for v in ev.victims], now)
                    self.eviction_log.extend((now, ev.pool, v.id, j.id, ev.reason) for v in ev.victims)
                    room = self.guarantees.get(account, 0) - self._load(account)
                if asks.exhausted:
                    return
                if room <= 0:
                    break

    def _evict(self, j: TraceJob, pool: str, victim_ids: list[str], now: float) -> None:
        need = self.model_of[pool].units(j.workers, j.gpus_per_worker)
        freed = sum(self.running[v][1] for v in victim_ids)
        now_part = max(0, need - freed)  # the free part of its room, set aside from now
        self.free[pool] -= now_part
        assert self.free[pool] >= 0, "an eviction set that does not make the gang fit"
        start_at = now + self.reclaim.grace_s
        self.pending[j.id] = _Pending(pool, need, now_part, start_at, list(victim_ids))
        self.pending_gpus[j.account] += self.gpus_on[j.id][pool]
        self.waiting[j.account].remove(j)
        o = self.outcomes[j.id]
        if o.first_estimate is None:
            o.first_estimate = start_at
        for v in victim_ids:
            self.stopping[v] = j.id
            self._push(start_at, "stop", v)
            self.recent[pool].append(now)
        self._push(start_at, "reclaim", j.id)  # after its victims' stops: pushed after them
        self.evictions += len(victim_ids)

    # Hooks for a failure model (sim_failures.py): without one, every start is placeable.

    def _placeable(self, j: TraceJob, pool: str, units: int, now: float) -> bool:
        return True

    def _event(self, kind: str, jid: str, seq: int, now: float) -> None:
        raise ValueError(f"unknown event {kind!r}")

    # The loop.

    def run(self) -> SimResult:
        now = 0.0
        capped, borrowing = self.policy == HARD_CAPS, self.policy == BORROW
        events = self.events
        while events:
            now = events[0][0]
            if self.horizon is not None and now > self.horizon:
                break
            arrived: list[str] = []
            while events and events[0][0] == now:
                _, seq, kind, jid = heapq.heappop(events)
                if kind == "tick":  # a window or hold starts or ends: only the round below
                    self._check_holds(now)
                    continue
                if kind not in ("arrive", "end", "stop", "reclaim"):  # a failure model's
                    self._event(kind, jid, seq, now)
                    continue
                o = self.outcomes[jid]
                if kind == "arrive":
                    if capped and self.eligible[jid] and min(self.gpus_on[jid].values()) > self.guarantees.get(
                            o.job.account, 0):
                        o.refused = "larger than its account's cap"
                        continue
                    self.waiting[o.job.account].append(o.job)
                    arrived.append(jid)
                elif kind == "end":
                    if self.end_seq.get(jid) != seq:
                        continue  # an attempt that was stopped
                    self._release(jid, now)
                    o.end = now
                elif kind == "stop":
                    self._stop(jid, now)
                else:  # reclaim
                    self._start_reclaimed(jid, now)
            for pool in self.recent.values():
                while pool and now - pool[0] >= RATE_WINDOW_S:
                    pool.popleft()
            if now - self.books.factors_at >= self.fairshare_every_s:
                self._refresh_factors(now)
            self.rounds += 1
            p = plan(now=now, pools=self.models, free_now=self.free, releases=self._releases(),
                     candidates=self._candidates(), depth=self.depth, policy=self.plan_policy,
                     max_examined=self.max_examined, windows=self.outages, holds=self._holds_now(),
                     domains=self.idle or None)
            for r in p.reservations:
                o = self.outcomes[r.job_id]
                if o.first_estimate is None:
                    o.first_estimate = r.start
            if arrived:
                planned = {r.job_id: r.start for r in p.reservations}
                planned.update((s.job_id, now) for s in p.starts)
                for jid in arrived:
                    self.outcomes[jid].submit_estimate = planned.get(jid)
            for s in p.starts:
                j = self.outcomes[s.job_id].job
                gpus = self.gpus_on[j.id][s.pool]
                if capped and self._load(j.account) + gpus > self.guarantees.get(j.account, 0):
                    continue  # the ledger refuses it: the round's earlier starts reached the cap
                units = self.model_of[s.pool].units(j.workers, j.gpus_per_worker)
                if not self._placeable(j, s.pool, units, now):
                    continue  # the nodes it may use are too few: it waits, as the backend holds it
                self.free[s.pool] -= units
                assert self.free[s.pool] >= 0, "the planner over-committed a pool"
                borrowed = borrowing and self._load(j.account) + gpus > self.guarantees.get(j.account, 0)
                self._start(j, s.pool, units, now, borrowed=borrowed)
                self.waiting[j.account].remove(j)
                if s.hold:
                    self.in_hold[j.id] = s.hold
            if borrowing:
                self._reclaim_round(now, {r.job_id: r.start for r in p.reservations})
        end = self.horizon if self.horizon is not None else now
        for jid in self.running:  # still running at the horizon
            o = self.outcomes[jid]
            start = self.started_at[jid]
            self.books.charge(o.job.account, o.held_gpus * (end - start), start, end, end)
        return SimResult(policy=self.policy, outcomes=list(self.outcomes.values()), busy_gpu_seconds=self.books.busy,
                         window=self.win, total_gpus=sum(p.gpus for p in self.pools),
                         usage_by_account=dict(self.books.window_usage), shares=self.shares, rounds=self.rounds,
                         evictions=self.evictions, reclaim_starts=self.reclaim_starts,
                         lost_in_window_gpu_seconds=self.lost_in_window, eviction_log=self.eviction_log,
                         used_gpu_seconds=self.books.used, spans=self.books.spans,
                         holds_honoured=dict(self.holds_honoured),
                         hold_used_gpu_s=dict(self.hold_used), topology_violations=self.topology_violations)


def simulate(trace: Sequence[TraceJob], pools: Sequence[SimPool], shares: Mapping[str, int], *,
             policy: str = RESERVATION, depth: int = 8, half_life_s: float = 7 * 86400,
             fairshare_every_s: float = 300, per_account: int = 32, max_examined: int = 2000,
             horizon: float | None = None, window: tuple[float, float] | None = None,
             guarantees: Mapping[str, int] | None = None, reclaim: Reclaim = Reclaim(),  # noqa: B008 (frozen)
             outages: Sequence[Outage] = (), holds: Sequence[Hold] = (), domain_futures: bool = True) -> SimResult:
    """Replay ``trace`` (sorted by arrival) and return what happened to every job.

    ``per_account`` bounds how many of one account's waiting jobs a round looks at (the
    gateway's look-past bound); ``horizon`` stops the clock (default: when all is done).
    ``guarantees`` (GPUs per account) is what ``hard-caps`` caps at and ``borrow`` borrows
    beyond; ``reclaim`` sets how ``borrow`` stops borrowed work; ``outages`` are the
    windows (maintenances, reservations) every round plans around; ``holds`` the advance
    reservations (their ``in_use`` is filled in by the replay); ``domain_futures``: releases
    name the blocks their gangs free (module docstring, "Topology").
    """
    return _Replay(trace, pools, shares, policy=policy, depth=depth, half_life_s=half_life_s,
                   fairshare_every_s=fairshare_every_s, per_account=per_account, max_examined=max_examined,
                   horizon=horizon, window=window, guarantees=guarantees, reclaim=reclaim,
                   outages=outages, holds=holds, domain_futures=domain_futures).run()
