"""What a dispatch round needs to know of guarantees and reclaim (docs/recovery.md): read once
per round, only where an administrator has set a guarantee.

The round's fair-share read says whether any guarantee is set (``ledger.fairshare_and_guarantees``);
only then does :func:`read` ask for the rest: the per-pool guarantees, the GPUs that work
within a guarantee holds, the borrowed gangs running now (the only possible victims), and
the preemptions still under way or made in the last minute (the rate limit). All of it is
handed to the pure decision (gateway/domain/decide.py) as plain values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, true
from sqlalchemy.orm import Session

from gateway.domain.guarantee import Guarantees
from gateway.domain.preempt import RATE_WINDOW_S, Running
from gateway.domain.states import JobState
from gateway.domain.tree import walk_up
from gateway.kit.timeutil import as_utc
from gateway.models.accounts import AccountPoolQuota
from gateway.models.jobs import Job, JobPreemption

# A gang holds its GPUs from its claim until it ends: every state in between.
HOLDING = tuple(s.value for s in (JobState.DISPATCHING, JobState.QUEUED, JobState.STARTING, JobState.RUNNING,
                                  JobState.REQUEUED, JobState.CANCELLING))


@dataclasses.dataclass
class RoundGuarantees:
    guarantees: Guarantees
    running: list[Running]  # borrowed gangs running now, not already being stopped
    # preemptor -> its victims, while they are still stopping or stopped less than a minute ago
    reclaiming: dict[str, tuple[str, ...]]
    recent: dict[str, list[float]]  # pool -> epoch seconds of its evictions in the last minute


_HELD = (select(Job.account_name, Job.pool, func.sum(func.coalesce(Job.held_gpus, Job.total_gpus)))
         .where(Job.state.in_(HOLDING), or_(Job.borrowed.is_(None), Job.borrowed.is_not(true())))
         .group_by(Job.account_name, Job.pool))
_OPEN_OR_RECENT = select(JobPreemption.job_id, JobPreemption.attempt, JobPreemption.pool, JobPreemption.preemptor_id,
                         JobPreemption.chosen_at, JobPreemption.ended_at)


def read(session: Session, *, now: datetime, overall: Mapping[str, int], has_pool_guarantee: Iterable[str],
         parents: Mapping[str, str | None], accounts: Iterable[str]) -> RoundGuarantees | None:
    """The round's view of guarantees, or None when no guarantee is set anywhere.

    ``overall``: account -> its overall guarantee and ``has_pool_guarantee``: the accounts
    with a per-pool one (both from the fair-share read); ``parents``: the account tree;
    ``accounts``: the accounts of the round's picked jobs.
    """
    with_pool = sorted(set(has_pool_guarantee))
    if not overall and not with_pool:
        return None
    per_pool = {(a, p): int(g) for a, p, g in session.execute(
        select(AccountPoolQuota.account_name, AccountPoolQuota.pool, AccountPoolQuota.guaranteed_gpus)
        .where(AccountPoolQuota.account_name.in_(with_pool), AccountPoolQuota.guaranteed_gpus.is_not(None)))
        } if with_pool else {}
    held: dict[str, int] = {}
    held_pool: dict[tuple[str, str], int] = {}
    for account, pool, gpus in session.execute(_HELD):
        held[account] = held.get(account, 0) + int(gpus or 0)
        if pool:
            held_pool[(account, pool)] = held_pool.get((account, pool), 0) + int(gpus or 0)
    since = now - timedelta(seconds=RATE_WINDOW_S)
    stopping: set[tuple[str, int]] = set()
    reclaiming: dict[str, tuple[str, ...]] = {}
    recent: dict[str, list[float]] = {}
    for job_id, attempt, pool, preemptor, chosen_at, ended_at in session.execute(
            _OPEN_OR_RECENT.where(or_(JobPreemption.ended_at.is_(None), JobPreemption.chosen_at >= since,
                                      JobPreemption.ended_at >= since))):
        if ended_at is None:
            stopping.add((job_id, attempt))
        # A preemptor waits for its victims, and for a minute after they ended: a backend may
        # show their nodes busy a little longer (Slurm's COMPLETING); it must not take more.
        if preemptor and (ended_at is None or as_utc(ended_at) >= since):
            reclaiming[preemptor] = (*reclaiming.get(preemptor, ()), job_id)
        if as_utc(chosen_at) >= since:
            recent.setdefault(pool, []).append(as_utc(chosen_at).timestamp())
    running = []
    for r in session.execute(select(Job.id, Job.account_name, Job.pool, Job.held_gpus, Job.total_gpus, Job.workers,
                                    Job.started_at, Job.checkpoint_at, Job.attempt)
                             .where(Job.state == JobState.RUNNING.value, Job.borrowed.is_(true()))):
        if (r.id, r.attempt) in stopping or r.started_at is None or not r.pool:
            continue
        checkpoint = as_utc(r.checkpoint_at)
        running.append(Running(id=r.id, account=r.account_name, pool=r.pool, gpus=int(r.held_gpus or r.total_gpus),
                               nodes=int(r.workers), borrowed=True, started_at=as_utc(r.started_at).timestamp(),
                               checkpoint_at=checkpoint.timestamp() if checkpoint else None))
    names = set(accounts) | set(held) | {a for a, _ in held_pool} | {r.account for r in running}
    chains = {a: chain for a in names if (chain := walk_up(parents, a)) is not None}
    return RoundGuarantees(Guarantees(chains=chains, overall=dict(overall), per_pool=per_pool, held=held,
                                      held_pool=held_pool),
                           running=running, reclaiming=reclaiming, recent=recent)
