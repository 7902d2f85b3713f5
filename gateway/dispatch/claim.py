"""The claim: pick pending jobs in fair-share order, admit and route each, in one transaction.

Exactly-once dispatch rests on three rules (docs/dispatch.md):

1. A job is claimed (pending -> dispatching, ledger reservation, routing decision) in ONE
   transaction, with ``FOR UPDATE SKIP LOCKED`` on Postgres so concurrent dispatchers
   never claim the same row. The claim carries a lease (``next_attempt_at``).
2. The backend call happens outside any transaction and is idempotent by the gateway job
   id (gateway/dispatch/submit.py).
3. A claim whose process died (lease expired while still ``dispatching``) is re-driven by
   any dispatcher (gateway/dispatch/recovery.py).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from sqlalchemy import Integer, String, bindparam, func, or_, select, text, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, aliased

from adapters.base import SubmitRequest
from gateway.dispatch import planning
from gateway.dispatch.common import (
    ACTOR,
    NO_LAUNCH,
    Launch,
    _is_deadlock,
    first_attempt,
    log,
    submit_request,
)
from gateway.dispatch.faults import NONE, Faults
from gateway.dispatch.liveness import Liveness
from gateway.domain.decide import Params, RoundResult, Snapshot, decide
from gateway.domain.routing import PoolView
from gateway.domain.states import JobState
from gateway.domain.windows import holds, outages
from gateway.jobs import claims as job_claims
from gateway.jobs import preemption
from gateway.jobs import service as jobs
from gateway.kit.db import transaction
from gateway.ledger import chains as ledger_chains
from gateway.ledger import guarantees
from gateway.ledger.decayed import Ledger
from gateway.ledger.round import RoundLedger
from gateway.models.jobs import Job
from gateway.models.specs import shape_of
from gateway.pools import windows as pool_windows

# A loose index scan over ix_job_queue: one index probe per account with pending jobs,
# instead of reading every pending row (100,000 rows -> ~1,000 probes). Works on SQLite too.
_ACCOUNTS_WITH_PENDING = text("""
WITH RECURSIVE acc(name) AS (
    SELECT (SELECT account_name FROM job WHERE state = :state ORDER BY account_name LIMIT 1)
    UNION ALL
    SELECT (SELECT account_name FROM job WHERE state = :state AND account_name > acc.name
            ORDER BY account_name LIMIT 1)
    FROM acc WHERE acc.name IS NOT NULL
)
SELECT name FROM acc WHERE name IS NOT NULL
""")


def accounts_with_pending(session: Session) -> list[str]:
    return list(session.execute(_ACCOUNTS_WITH_PENDING, {"state": JobState.PENDING.value}).scalars())


# Accounts probed in fair-share order before the loose index scan is asked which have
# pending jobs at all: most rounds fill from the first few accounts, and the scan costs one
# index probe per account with pending work (~20 ms at 1,000 accounts).
_PROBE_MISSES = 8


def _pick_batch(lock: bool):
    """Postgres: the first ``lims[i]`` due pending jobs of each account ``names[i]``, in that order, one statement.

    ``unnest(names, lims) WITH ORDINALITY`` joined LATERAL to the per-account query (the same
    index probe, ``FOR UPDATE SKIP LOCKED`` inside it): a round's pick was one query per account.
    """
    acc = (func.unnest(bindparam("names", type_=ARRAY(String)), bindparam("lims", type_=ARRAY(Integer)))
           .table_valued("name", "lim", with_ordinality="ord").render_derived(name="pick_account"))
    due = or_(Job.next_attempt_at.is_(None), Job.next_attempt_at <= bindparam("now"))
    per = (select(Job).where(Job.state == JobState.PENDING.value, Job.account_name == acc.c.name, due)
           .order_by(Job.priority.desc(), Job.id).limit(acc.c.lim))
    if lock:
        per = per.with_for_update(skip_locked=True)
    per = per.lateral("picked")
    return (select(aliased(Job, per)).select_from(acc).join(per, true())
            .order_by(acc.c.ord, per.c.priority.desc(), per.c.id))


_PICK_BATCH = {lock: _pick_batch(lock) for lock in (False, True)}


def pending_order(session: Session, *, now: datetime, limit: int, lock: bool,
                  factors: dict[str, float], per_account: int | None = None) -> list[Job]:
    """The next ``limit`` dispatchable pending jobs in fair-share order.

    Accounts by fair-share factor (highest first), within an account by priority then
    age, at most ``per_account`` of one account's. Uses the (state, account_name, priority,
    id) index: one small query per account with pending work, never a scan of every
    pending job. Accounts are probed in that order directly; after ``_PROBE_MISSES``
    accounts with nothing due, only accounts the loose index scan finds with pending jobs are.

    Each account is asked for ``min(per_account, limit - jobs picked before it)``. On
    Postgres the accounts whose ask cannot depend on what the ones before them return
    (while a full ``per_account`` still fits) are asked in one statement: the same asks, the
    same rows locked, the same order, in a statement per batch instead of per account.
    """
    due = or_(Job.next_attempt_at.is_(None), Job.next_attempt_at <= now)
    per = per_account or limit
    batched = session.get_bind().dialect.name == "postgresql"
    picked: list[Job] = []
    state = {"misses": 0, "with_pending": None}

    def take(asks: list[tuple[str, int]]) -> None:
        if batched and len(asks) > 1:
            got = list(session.scalars(_PICK_BATCH[lock], {"names": [a for a, _ in asks], "lims": [n for _, n in asks],
                                                           "now": now}))
        else:
            stmt = (select(Job).where(Job.state == JobState.PENDING.value, Job.account_name == asks[0][0], due)
                    .order_by(Job.priority.desc(), Job.id).limit(asks[0][1]))
            if lock:
                stmt = stmt.with_for_update(skip_locked=True)
            got = list(session.scalars(stmt))
        picked.extend(got)
        have = {job.account_name for job in got}
        state["misses"] += sum(a not in have for a, _ in asks)

    def fill(accounts: list[str], probing: bool) -> None:
        i = 0
        while i < len(accounts) and len(picked) < limit:
            if probing and state["with_pending"] is None and state["misses"] >= _PROBE_MISSES:
                state["with_pending"] = set(accounts_with_pending(session))
            with_pending = state["with_pending"] if probing else None
            room = limit - len(picked)
            asks: list[tuple[str, int]] = []
            while i < len(accounts) and (not asks or (batched and room >= per)):
                account = accounts[i]
                i += 1
                if with_pending is not None and account not in with_pending:
                    continue
                asks.append((account, min(per, room)))
                room -= asks[-1][1]
            if asks:
                take(asks)

    fill(sorted(factors, key=lambda a: (-factors[a], a)), probing=True)
    if len(picked) < limit:
        # Accounts with pending jobs but no factor (not in the tree passed): last, by name.
        fill(sorted(set(accounts_with_pending(session)) - set(factors)), probing=False)
    return picked


class Claimer:
    """The claim round: read a snapshot (pending jobs picked in fair-share order, the pools'
    views, the ledger's view of their chains), decide (gateway/domain/decide.py, pure),
    apply the result in bulk, in one transaction; then hand what it claimed to the submitter."""

    def __init__(self, *, sessions, backends: dict, settings, clock, capacity, submitter, recent_ends, weights,
                 liveness: Liveness, launch: Launch = NO_LAUNCH, faults: Faults = NONE) -> None:
        self.faults = faults
        self.liveness = liveness  # whose claims these are (its key on each; dispatch/liveness.py)
        self.launch = launch
        self.sessions = sessions
        self.backends = backends
        self.settings = settings
        self.clock = clock
        self.capacity = capacity
        self.submitter = submitter
        self.recent_ends = recent_ends  # gangs this process saw end lately (Outcomes._finish appends)
        self.weights = weights

    def dispatch_round(self) -> list[str]:
        """Claim and submit up to ``dispatch_batch`` jobs. Returns the claimed job ids."""
        if not self.backends:
            return []
        fresh_views = self.capacity.views(fresh=True)
        is_pg = not self.settings.is_sqlite
        self.launch.prime()
        for attempt in range(1, 4):
            now = self.clock()
            prepared: dict[str, tuple[str, SubmitRequest]] = {}
            try:
                with transaction(self.sessions) as s:
                    snap, rl, natives = self._snapshot(s, fresh_views, now, lock=is_pg)
                    result = decide(snap, self._params())
                    self._apply(s, result, rl, now, natives)
                    for c in result.claims:
                        prepared[c.job.id] = (c.pool, submit_request(c.job, first_attempt=first_attempt(c.job, False),
                                                                     pool=c.pool, launch=self.launch))
                break
            except (ledger_chains.ChainChanged, OperationalError) as exc:
                # The account tree or a limited chain's totals moved between the snapshot and
                # the locks (gateway/ledger/round.py), or two dispatchers locked two account
                # chains in opposite orders (Postgres aborts one): nothing of this claim was
                # written; claim again.
                if (isinstance(exc, OperationalError) and not _is_deadlock(exc)) or attempt == 3:
                    raise
                log.info("claim round %d rolled back (%s); retrying", attempt, type(exc).__name__)
        claimed = list(prepared)
        if claimed:
            self.faults.after_claim()  # crash window 1 (tests only: dispatch/faults.py)
        self.submitter.submit_all(claimed, prepared=prepared)
        return claimed

    def _planned(self) -> bool:
        # With a backend queue allowed (pool_queue_depth), the backend's own scheduler
        # orders what waits there: the old pick hands jobs to it.
        return self.settings.scheduling_policy == "reservation" and not self.settings.pool_queue_depth

    def _params(self) -> Params:
        # A greedy round that plans only because a window is set reserves nothing (depth 0).
        depth = self.settings.reservation_depth if self.settings.scheduling_policy == "reservation" else 0
        return Params(weights=self.weights, queue_depth=self.settings.pool_queue_depth,
                      cost_factor=self.settings.routing_cost_factor, reservation_depth=depth,
                      max_starts=self.settings.dispatch_batch,
                      preempt_min_runtime_s=self.settings.preempt_min_runtime_s,
                      preempt_max_per_pool_per_minute=self.settings.preempt_max_per_pool_per_minute)

    def _snapshot(self, s: Session, fresh_views: dict[str, PoolView], now: datetime, *,
                  lock: bool) -> tuple[Snapshot, RoundLedger, dict[str, str]]:
        """What the round decides over: the picked jobs (locked on Postgres), copies of the
        pools' views, the planner's inputs, and the ledger read once for the picked accounts;
        and the backends' own reservations of the advance reservations (id -> name)."""
        views = {name: v.for_round() for name, v in fresh_views.items()}
        shares, overall, with_pool = Ledger.of(self.settings).fairshare_and_guarantees(s, now=now)
        factors = {name: fs.factor for name, fs in shares.items()}
        # Windows and advance reservations (docs/planning.md) need time, which only the planner
        # sees: with any that has not ended, the round is planned whatever the policy.
        planned_windows, held = pool_windows.for_round(s, views, now=now)
        windows = outages(views, planned_windows, now=now)
        held_now = holds(views, held, planning.hold_gangs(s, views, held, now=now), now=now) if held else []
        planned = self._planned() or bool(windows) or bool(held_now)
        picked = pending_order(s, now=now, lock=lock, factors=factors,
                               limit=self.settings.scheduling_window if planned else self.settings.dispatch_batch,
                               per_account=self.settings.scheduling_per_account if planned else None)
        # The ledger read once for the round's accounts (the view the quota rules judge);
        # the reservations written together at the end (gateway/ledger/round.py).
        rl = RoundLedger(s, accounts_=(job.account_name for job in picked), now=now)
        snap = Snapshot(now=now, picked=picked, views=views, planned=planned,
                        shapes={job.id: shape_of(job) for job in picked}, windows=windows, holds=held_now,
                        quota=rl.view)
        if picked and (overall or with_pool):  # guarantees are set somewhere (docs/recovery.md)
            g = guarantees.read(s, now=now, overall=overall, has_pool_guarantee=with_pool,
                                parents={name: fs.parent for name, fs in shares.items()},
                                accounts={job.account_name for job in picked})
            if g is not None:
                snap.guarantees, snap.running, snap.reclaiming = g.guarantees, g.running, g.reclaiming
                snap.recent_evictions = g.recent
        if planned:
            snap.releases, snap.registry_held = planning.releases(s, views, now=now)
            snap.recent_ends, snap.monotonic_now = list(self.recent_ends), time.monotonic()
        return snap, rl, {h.id: h.native for h in held if h.native}

    def _apply(self, s: Session, result: RoundResult, rl: RoundLedger, now: datetime,
               natives: dict[str, str]) -> None:
        """Write the decision: failures through the state machine's ``finish``; claims, waiting
        notes and estimates through the one writer (``job_claims.Claims``), the reservations
        through the round's ledger, under the chains' locks (both in bulk)."""
        for f in result.failures:
            jobs.finish(s, f.job, JobState.FAILED, ended_at=now, actor=ACTOR, reason=f.reason)
        writes = job_claims.Claims(s)
        for w in result.waiting:
            writes.note_waiting(w.job, reason=w.reason, actor=ACTOR)
        for e in result.estimates:
            writes.note_estimate(e.job, start=e.start, pool=e.pool, reason=e.reason)
        lease_until = now + timedelta(seconds=self.settings.dispatch_lease_s)
        for c in result.claims:
            data = {"pool": c.pool, "fairshare_position": c.position}
            if c.borrowed is not None:
                data.update(borrowed=c.borrowed, guarantee=c.guarantee)
            # A gang starting in an advance reservation the backend holds too runs in the backend's.
            native = natives.get(c.hold) or None
            if c.hold:
                data.update(advance_reservation=c.hold, backend_reservation=native)
            writes.claim(c.job, pool=c.pool, held_gpus=c.held_gpus, reason=c.reason, lease_until=lease_until,
                         actor=ACTOR, data=data, borrowed=c.borrowed, backend_reservation=native,
                         owner=self.liveness.key)
        writes.flush()
        rl.write(result.reservations, actor=ACTOR)
        if result.reclaims:
            preemption.choose(s, result.reclaims, now=now, grace_s=self.settings.preempt_grace_s, actor=ACTOR)
