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

import dataclasses
import time
from datetime import datetime, timedelta, timezone

from sqlalchemy import Integer, String, bindparam, func, or_, select, text, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, aliased

from adapters.base import SubmitRequest
from gateway.dispatch.common import ACTOR, _is_deadlock, log, submit_request
from gateway.jobs import service as jobs
from gateway.jobs.models import Job
from gateway.jobs.states import JobState
from gateway.kit.db import transaction
from gateway.kit.errors import QuotaExceeded
from gateway.ledger import service as ledger
from gateway.ledger.round import RoundLedger
from gateway.dispatch import planning
from gateway.routing.service import JobShape, PoolView, held_gpus, ranked, route, take
from gateway.scheduling.planner import Candidate, plan

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


@dataclasses.dataclass(frozen=True)
class _Round:
    """What one claim round writes together at its end: the ledger's side and the jobs' side."""

    ledger: RoundLedger
    claims: jobs.Claims


class ClaimMixin:
    def dispatch_round(self) -> list[str]:
        """Claim and submit up to ``dispatch_batch`` jobs. Returns the claimed job ids."""
        if not self.backends:
            return []
        fresh_views = self.views(fresh=True)
        is_pg = not self.settings.is_sqlite
        for attempt in range(1, 4):
            views = {name: dataclasses.replace(v) for name, v in fresh_views.items()}
            now = self.clock()
            claimed: list[str] = []
            prepared: dict[str, tuple[str, SubmitRequest]] = {}
            try:
                with transaction(self.sessions) as s:
                    factors = {name: fs.factor for name, fs in ledger.fairshare(s, now=now).items()}
                    # With a backend queue allowed (pool_queue_depth), the backend's own
                    # scheduler orders what waits there: the old pick hands jobs to it.
                    planned = self.settings.scheduling_policy == "reservation" and not self.settings.pool_queue_depth
                    picked = pending_order(s, now=now, lock=is_pg, factors=factors,
                                           limit=self.settings.scheduling_window if planned
                                           else self.settings.dispatch_batch,
                                           per_account=self.settings.scheduling_per_account if planned else None)
                    # The ledger read once for the round's accounts; reservations of chains
                    # without limits written together at the end (gateway/ledger/round.py).
                    rnd = _Round(RoundLedger(s, accounts_=(job.account_name for job in picked), now=now),
                                 jobs.Claims(s))
                    if planned:
                        self._plan_round(s, picked, views, now, rnd)
                    else:
                        for position, job in enumerate(picked, start=1):
                            self._claim_one(s, job, views, now, position, rnd)
                    rnd.claims.flush()
                    rnd.ledger.flush()
                    for job in picked:
                        if job.state == JobState.DISPATCHING.value:
                            claimed.append(job.id)
                            prepared[job.id] = (job.backend, submit_request(
                                job, first_attempt=self._first_attempt(job, False)))
                break
            except (ledger.ChainChanged, OperationalError) as exc:
                # The account tree moved under a reservation, or two dispatchers locked two
                # account chains in opposite orders (Postgres aborts one): nothing of this
                # claim was written; claim again.
                if isinstance(exc, OperationalError) and not _is_deadlock(exc) or attempt == 3:
                    raise
                log.info("claim round %d rolled back (%s); retrying", attempt, type(exc).__name__)
        if claimed and self.settings.debug_pause_after_claim_s:
            time.sleep(self.settings.debug_pause_after_claim_s)  # crash window 1 (tests)
        self._submit_all(claimed, prepared=prepared)
        return claimed

    @staticmethod
    def _first_attempt(job: Job, recovering: bool) -> bool:
        # The first claim of a job is the only one that can have submitted it; a retry or a
        # recovery must let the adapter look for an earlier submission.
        return job.dispatch_attempts == 1 and not recovering and job.state == JobState.DISPATCHING.value

    def _claim_one(self, s: Session, job: Job, views: dict[str, PoolView], now: datetime, position: int,
                   rnd: _Round, only: str | None = None, shape: JobShape | None = None) -> None:
        rl = rnd.ledger
        shape = shape or JobShape.of(job)
        verdict = rl.budget_verdict(job=job, now=now)
        if verdict is not None and verdict[0] == "never":
            jobs.finish(s, job, JobState.FAILED, ended_at=now, actor=ACTOR, reason=f"cannot run: {verdict[1]}")
            return
        if verdict is not None:  # not this period: held with the reason, never "waiting for capacity"
            self._note_waiting(rnd, job, f"held: {verdict[1]}")
            return
        refusals: dict[str, str] = {}
        # For a pinned job, reserve() below applies the same rule; checking first only helps
        # routing choose between pools.
        # Asked pool by pool only when a limit is set in the account's chain (read once per
        # round: with many pools, the check per pool was most of a round's queries).
        limited = rl.limited(job.account_name)
        if job.requested_backend == "auto" and len(views) > 1 and limited:
            for name, view in views.items():
                ok, why = ledger.admission_check(s, job=job, pool=name, now=now, gpus=held_gpus(shape, view))
                if not ok:
                    refusals[name] = why
        decision = route(shape, job.requested_backend, views, quota_refusals=refusals, weights=self.weights,
                         queue_depth=self.settings.pool_queue_depth, cost_factor=self.settings.routing_cost_factor,
                         only=only)
        if decision.rejected:
            jobs.finish(s, job, JobState.FAILED, ended_at=now, actor=ACTOR, reason=f"cannot run: {decision.reason}")
            return
        if decision.pool is None:
            self._note_waiting(rnd, job, f"{decision.reason} (fair-share position {position})")
            return
        # What the gang will hold there: whole nodes on a node-exclusive pool.
        held = held_gpus(shape, views[decision.pool])
        if limited:
            try:  # reserve() writes nothing when it refuses: no savepoint needed
                ledger.reserve(s, job=job, pool=decision.pool, actor=ACTOR, now=now, gpus=held)
            except QuotaExceeded as exc:
                self._note_waiting(rnd, job, f"quota: {exc.detail}")
                return
        else:  # nothing in the chain can refuse it: written with the round's others
            rl.defer_reserve(job=job, pool=decision.pool, actor=ACTOR, now=now, gpus=held)
        rnd.claims.claim(job, pool=decision.pool, held_gpus=held, reason=decision.reason,
                         lease_until=now + timedelta(seconds=self.settings.dispatch_lease_s), actor=ACTOR,
                         data={"pool": decision.pool, "fairshare_position": position})
        take(shape, views[decision.pool])

    def _plan_round(self, s: Session, picked: list[Job], views: dict[str, PoolView], now: datetime,
                    rnd: _Round) -> None:
        """Claim what the plan starts now; note a planned start (estimate) on the rest.

        Conservative backfill over every pool (gateway/dispatch/planning.py,
        gateway/scheduling/planner.py): the top ``reservation_depth`` jobs that cannot
        start now hold a reservation no lower job may delay.
        """
        rl = rnd.ledger
        candidates: list[Candidate] = []
        blocked: dict[str, str] = {}  # job id -> why it cannot be admitted now
        usable_of: dict[str, tuple[str, ...]] = {}
        shapes: dict[str, JobShape] = {}
        # ranked() per (shape, pool asked for): the views do not move before the plan is made.
        ranking: dict[tuple[JobShape, str], list[str]] = {}
        known = rl.known_pools()
        for job in picked:
            shape = shapes[job.id] = JobShape.of(job)
            verdict = rl.budget_verdict(job=job, now=now)
            if verdict is not None:
                # "never" fails it below (the greedy path's words); else held this period.
                blocked[job.id] = f"held: {verdict[1]}"
                candidates.append(planning.candidate(job, (), blocked[job.id]))
                continue
            requested = job.requested_backend
            # The pools route() may use (kind, fit, state), best first by its score: the
            # planner breaks ties between equally early starts by this order.
            names = ranking.get((shape, requested))
            if names is None:
                names = ranking[(shape, requested)] = ranked(shape, requested, views, weights=self.weights,
                                                             cost_factor=self.settings.routing_cost_factor)
            refusals: list[str] = []
            limited = rl.limited(job.account_name)
            if not limited and known.issuperset(names):  # nothing in the chain can refuse it
                usable_of[job.id] = tuple(n for n in names if views[n].capacity is not None)
                candidates.append(planning.candidate(job, usable_of[job.id]))
                continue
            usable: list[str] = []
            for name in names:
                view = views[name]
                if view.capacity is None:
                    continue
                if not limited and name in known:
                    usable.append(name)
                    continue
                ok, why = ledger.admission_check(s, job=job, pool=name, now=now, gpus=held_gpus(shape, view))
                if ok:
                    usable.append(name)
                else:
                    refusals.append(f"{name}: {why}")
            usable_of[job.id] = tuple(usable)
            if not usable and refusals:
                blocked[job.id] = "quota: " + "; ".join(refusals)
            candidates.append(planning.candidate(job, tuple(usable), blocked.get(job.id, "")))
        rels, registry_held = planning.releases(s, views, now=now)
        lagging, registry_held = planning.lagging_ends(views, registry_held, list(self.recent_ends), now=now,
                                                       monotonic_now=time.monotonic())
        rels += lagging
        t_now = now.timestamp()
        result = plan(now=t_now, pools=planning.pool_models(views), free_now=planning.free_now(views, registry_held),
                      releases=rels, candidates=candidates, depth=self.settings.reservation_depth,
                      max_starts=self.settings.dispatch_batch)
        starts = {p.job_id: p for p in result.starts}
        reserved = {p.job_id: p for p in result.reservations}
        for position, job in enumerate(picked, start=1):
            start = starts.get(job.id)
            if start is not None or job.id in blocked or not usable_of.get(job.id):
                # Starts now (routed to the planned pool), or the greedy path's own words:
                # fail what can never run, hold what is over budget or quota.
                # The reason still says why not the other pools.
                self._claim_one(s, job, views, now, position, rnd, only=start.pool if start is not None else None,
                                shape=shapes[job.id])
                if job.state == JobState.PENDING.value:
                    rnd.claims.note_estimate(job, start=None, pool=None, reason=job.state_reason.split(" (fair-share")[0])
                continue
            held = reserved.get(job.id)
            decision = route(shapes[job.id], job.requested_backend, views, weights=self.weights,
                             queue_depth=self.settings.pool_queue_depth)
            if held is not None:
                at = datetime.fromtimestamp(held.start, tz=timezone.utc)
                why = (f"reserved on {held.pool}: planned start {at.isoformat(timespec='seconds')}, the earliest "
                       f"of the pools it may use ({', '.join(usable_of[job.id])}) as running jobs reach their "
                       "time limits")
                rnd.claims.note_estimate(job, start=at, pool=held.pool, reason=why)
                self._note_waiting(rnd, job, f"waiting for capacity: {why} (fair-share position {position})")
                continue
            no_estimate = result.unplanned.get(job.id) or (
                f"behind the {self.settings.reservation_depth} jobs that hold reservations; no estimate yet")
            rnd.claims.note_estimate(job, start=None, pool=None, reason=no_estimate)
            if decision.pool is not None:  # it fits now, but only on capacity a higher job has reserved
                why = f"waiting for capacity: held back, starting now would delay a higher job's reservation; {no_estimate}"
            else:
                why = decision.reason
            self._note_waiting(rnd, job, f"{why} (fair-share position {position})")

    def _note_waiting(self, rnd: _Round, job: Job, reason: str) -> None:
        rnd.claims.note_waiting(job, reason=reason, actor=ACTOR)
