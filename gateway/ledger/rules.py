"""The ledger's admission rules and the reads they need: billing weights, the concurrent-GPU
limits (overall and per pool), GPU-hour budgets and their periods, what a job was charged.

``admission_check`` evaluates the rule without locking or writing; ``reserve``
(``service.py``) applies the same ``_refusal`` under the chain's lock; ``budget_verdict`` /
``budget_verdict_of`` is the budget's word at submit (held, or never).
"""

from __future__ import annotations

import dataclasses
import math
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.accounts.tree import subtree_names, up_cte
from gateway.domain.shapes import normalise_gpu_type
from gateway.kit.errors import NotFound
from gateway.kit.timeutil import as_utc, utcnow
from gateway.models.accounts import AccountPoolQuota, AccountQuota
from gateway.models.ledger import (
    AccountBalance,
    AccountPoolBalance,
    GpuBillingWeight,
    LedgerEntry,
    Reservation,
    UsageBucket,
)
from gateway.models.pools import Pool
from gateway.models.specs import field_of
from gateway.pools.service import require_known


def _now(now: datetime | None) -> datetime:
    return as_utc(now) or utcnow()


def _hours(gpu_seconds: float) -> str:
    return f"{gpu_seconds / 3600:.1f}"


def billing_weight(session: Session, pool: str, gpu_type: str | None) -> float:
    """The GPU type's weight in ``pool``, else the pool's default ("*"), else the pool's cost, else 1."""
    gpu_type = normalise_gpu_type(gpu_type)  # jobs recorded before types were normalised
    weights = dict(session.execute(select(GpuBillingWeight.gpu_type, GpuBillingWeight.weight).where(
        GpuBillingWeight.pool == pool, GpuBillingWeight.gpu_type.in_([gpu_type or "*", "*"]))).all())
    for key in (gpu_type or "*", "*"):
        if key in weights:
            return float(weights[key])
    return float(session.scalar(select(Pool.cost).where(Pool.name == pool)) or 1.0)


def routable_pools(session: Session) -> list[str]:
    """Pools that may take new jobs now (configured, state ``active``), by name."""
    return list(session.scalars(select(Pool.name).where(Pool.configured.is_(True), Pool.state == "active")
                                .order_by(Pool.name)))


def pool_balances(session: Session, account: str) -> dict[str, int]:
    """GPUs ``account`` and its subtree hold, per pool (pools with a row only)."""
    return {p: int(n) for p, n in session.execute(select(AccountPoolBalance.pool, AccountPoolBalance.reserved_gpus)
                                                  .where(AccountPoolBalance.account_name == account)
                                                  .order_by(AccountPoolBalance.pool))}


def committed_for(gpus: int, time_limit_s: int, weight: float) -> int:
    return math.ceil(gpus * time_limit_s * weight - 1e-9)


def _run_charge(r: Reservation, start: datetime, end: datetime) -> tuple[float, int]:
    """(seconds, GPU-seconds) a run from ``start`` to ``end`` costs, clamped to the time limit and the commitment."""
    seconds = min(max((end - start).total_seconds(), 0.0), float(r.time_limit_s))
    return seconds, min(committed_for(r.gpus, 1, r.billing_weight * seconds) if seconds else 0, r.committed_gpu_seconds)


def period_start(period: str, window_days: int, now: datetime) -> date:
    today = now.date()
    if period == "month":
        return today.replace(day=1)
    return today - timedelta(days=window_days - 1)


def period_label(period: str, window_days: int) -> str:
    return "this month" if period == "month" else f"in the last {window_days} days"


_CHARGED_SINCE = select(func.coalesce(func.sum(UsageBucket.gpu_seconds), 0)).where(
    UsageBucket.account_name.in_(subtree_names()), UsageBucket.day >= bindparam("since"))


def charged_in_period(session: Session, account_name: str, since: date) -> int:
    """Net charges (usage + debits - credits - refunds) of a subtree since ``since``."""
    return int(session.scalar(_CHARGED_SINCE, {"root": account_name, "since": since}) or 0)


def _pool_limits(session: Session, names: list[str], pools: list[str] | None) -> dict[tuple[str, str], tuple[int, int]]:
    """(account, pool) -> (limit, GPUs held there) for every per-pool limit set in the chain."""
    stmt = (select(AccountPoolQuota.account_name, AccountPoolQuota.pool, AccountPoolQuota.max_gpus,
                   func.coalesce(AccountPoolBalance.reserved_gpus, 0))
            .outerjoin(AccountPoolBalance, (AccountPoolBalance.account_name == AccountPoolQuota.account_name)
                       & (AccountPoolBalance.pool == AccountPoolQuota.pool))
            .where(AccountPoolQuota.account_name.in_(names), AccountPoolQuota.max_gpus.isnot(None)))
    if pools is not None:
        stmt = stmt.where(AccountPoolQuota.pool.in_(pools))
    return {(a, p): (int(limit), int(used)) for a, p, limit, used in session.execute(stmt)}


def _refusal(session: Session, *, names: list[str], balances: dict[str, AccountBalance], gpus: int,
             pool: str | None, committed: int, now: datetime,
             quotas: dict[str, Any] | None = None,
             pool_limits: dict[tuple[str, str], tuple[int, int]] | None = None) -> str | None:
    """Why the gang does not fit (first failing limit, leaf first), or None.

    ``quotas`` (name -> quota row) and ``pool_limits`` ((name, pool) -> (limit, held)) may
    be passed when already read with the locks. ``pool`` None means "any routable pool":
    a per-pool limit refuses only when it blocks every one of them.
    """
    if quotas is None:
        quotas = {q.account_name: q for q in session.scalars(
            select(AccountQuota).where(AccountQuota.account_name.in_(names)))}
    pools = [pool] if pool else None
    if pool_limits is None:
        pools = pools or routable_pools(session)
        pool_limits = _pool_limits(session, names, pools)
    for name in reversed(names):
        q = quotas.get(name)
        b = balances.get(name) or _ZERO
        if q is not None and q.max_gpus is not None and b.reserved_gpus + gpus > q.max_gpus:
            return f"{name}: {b.reserved_gpus} of {q.max_gpus} concurrent GPUs in use, job needs {gpus}"
        blocked = []
        for p in pools or []:
            limit, used = pool_limits.get((name, p), (None, 0))
            if limit is not None and used + gpus > limit:
                blocked.append(f"{name}: {used} of {limit} concurrent GPUs in use in pool {p}, job needs {gpus}")
        if blocked and len(blocked) == len(pools):
            return "; ".join(blocked)
        if q is None:
            continue
        # max_queued_jobs and max_queued_jobs_per_user are not the ledger's: they count the
        # jobs that wait to start, judged once, at submit (gateway/jobs/caps.py; issue #46).
        if q.budget_gpu_seconds is not None:
            since = period_start(q.budget_period, q.budget_window_days, now)
            charged = charged_in_period(session, name, since)
            if charged + b.committed_gpu_seconds + committed > q.budget_gpu_seconds:
                return (f"{name}: GPU-hour budget {period_label(q.budget_period, q.budget_window_days)}: "
                        f"{_hours(charged)} used + {_hours(b.committed_gpu_seconds)} committed of "
                        f"{_hours(q.budget_gpu_seconds)} GPU-hours, job needs {_hours(committed)}")
    return None


# The account chain with its GPU-hour budgets in one round trip (this runs on every submission).
_BUDGET_UP = up_cte("budget_chain")


_BUDGET_READ = (
    select(_BUDGET_UP.c.name, AccountQuota.budget_gpu_seconds, AccountQuota.budget_period,
           AccountQuota.budget_window_days)
    .select_from(_BUDGET_UP.outerjoin(AccountQuota, AccountQuota.account_name == _BUDGET_UP.c.name))
    .order_by(_BUDGET_UP.c.depth.desc())
)


def budget_verdict(session: Session, *, account: str, total_gpus: int, time_limit_s: int, gpu_type: str | None,
                   now: datetime | None = None) -> tuple[str, str] | None:
    """Whether a job can ever run within the GPU-hour budgets of its account chain.

    Returns None when it can (now or once other jobs end), ``("never", why)`` when it needs
    more than a whole budget period holds, ``("later", why)`` when this period's budget
    has too little left even with nothing else running (it can run once the period
    renews, or after an admin credit). The job's need is its time limit at the cheapest
    pool's billing weight, so a job routable to either pool is not refused for the dearer one.
    """
    rows = session.execute(_BUDGET_READ, {"leaf": account}).all()  # root first
    if not rows:
        raise NotFound(f"no account {account!r}")
    return budget_verdict_of(session, rows, total_gpus=total_gpus, time_limit_s=time_limit_s, gpu_type=gpu_type,
                             now=now)


def budget_verdict_of(session: Session, chain: list[Any], *, total_gpus: int, time_limit_s: int,
                      gpu_type: str | None, now: datetime | None = None) -> tuple[str, str] | None:
    """:func:`budget_verdict` from an account chain already read (root first; rows with
    ``name``, ``budget_gpu_seconds``, ``budget_period``, ``budget_window_days``): the submit
    path gets it with its cap check. No read at all when no budget is set (the common case)."""
    now = _now(now)
    names = [r.name for r in chain]
    quotas = {r.name: r for r in chain if r.budget_gpu_seconds is not None}
    if not quotas:
        return None  # the common case costs two small reads
    weight = min((billing_weight(session, p, gpu_type) for p in routable_pools(session)), default=1.0)
    needs = committed_for(total_gpus, time_limit_s, weight)
    for name in reversed(names):
        q = quotas.get(name)
        if q is None or q.budget_gpu_seconds is None:
            continue
        label = "monthly" if q.budget_period == "month" else f"{q.budget_window_days}-day"
        if needs > q.budget_gpu_seconds:
            return ("never", (f"{name}'s {label} GPU-hour budget is {_hours(q.budget_gpu_seconds)} GPU-hours and "
                             f"this job needs {_hours(needs)} ({total_gpus} GPUs x {time_limit_s / 3600:.2f} h "
                             f"time limit); ask for fewer GPUs or a shorter time limit"))
        charged = charged_in_period(session, name, period_start(q.budget_period, q.budget_window_days, now))
        left = q.budget_gpu_seconds - charged
        if needs > left:
            when = "the budget renews next month" if q.budget_period == "month" else "older usage leaves the window"
            return ("later", (f"{name}'s GPU-hour budget {period_label(q.budget_period, q.budget_window_days)} has "
                             f"{_hours(max(left, 0))} of {_hours(q.budget_gpu_seconds)} GPU-hours left and this job "
                             f"needs {_hours(needs)}: it is held until {when} or an admin credits the account"))
    return None


def _job_pool(session: Session, job: Any, pool: str | None) -> str | None:
    pool = pool or job.pool
    return require_known(session, pool, "pool") if pool is not None else None


def admission_check(session: Session, *, job: Any, pool: str | None, now: datetime | None = None,
                    gpus: int | None = None) -> tuple[bool, str]:
    """Would ``job`` be admitted now? The same rule as :func:`reserve`, without locking or writing.

    Args:
        job: the job (``account_name``, ``total_gpus``, ``time_limit_s``, ``spec``, ``username``).
        pool: a pool name, or None for "any routable pool".
        gpus: the GPUs the gang would hold in ``pool`` (whole nodes on a node-exclusive pool);
            default ``job.total_gpus``.

    Returns:
        (fits, reason): the reason is a sentence for the user either way.
    """
    now = _now(now)
    pool = _job_pool(session, job, pool)
    r = session.get(Reservation, job.id)
    if r is not None and r.status in ("reserved", "started"):
        return True, f"already holds a reservation of {r.gpus} GPUs in pool {r.pool}"
    names = [a.name for a in accounts.chain(session, job.account_name)]
    balances = {b.account_name: b for b in session.scalars(
        select(AccountBalance).where(AccountBalance.account_name.in_(names)))}
    gpu_type = normalise_gpu_type(field_of(job, "gpu_type", session))
    weight = billing_weight(session, pool, gpu_type) if pool else min(
        (billing_weight(session, p, gpu_type) for p in routable_pools(session)), default=1.0)
    gpus = job.total_gpus if gpus is None else gpus
    committed = committed_for(gpus, job.time_limit_s, weight)
    why = _refusal(session, names=names, balances=balances, gpus=gpus, pool=pool,
                   committed=committed, now=now)
    if why:
        return False, why
    return True, f"fits the quotas of {' > '.join(names)}"


@dataclasses.dataclass(frozen=True)
class _BalanceView:
    reserved_gpus: int = 0
    committed_gpu_seconds: int = 0
    charged_gpu_seconds: int = 0
    queued_jobs: int = 0


_ZERO = _BalanceView()


def charged_gpu_seconds(session: Session, *, job_id: str) -> int:
    """Net GPU-seconds charged to one job so far (every run segment, minus refunds)."""
    return int(session.scalar(select(func.coalesce(func.sum(LedgerEntry.gpu_seconds), 0)).where(
        LedgerEntry.job_id == job_id)) or 0)
