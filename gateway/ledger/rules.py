"""The reads the quota rules need, and the rules asked with a session.

The rules themselves are pure, in ``gateway/domain/quota.py``: this module reads what they
judge (a :class:`~gateway.domain.quota.ChainView`: the chain's limits, what its subtrees
hold, what each budget was charged this period, the pools' billing terms) and asks them.
``admission_check`` judges without locking or writing; ``reserve`` (``service.py``) judges
the same ``quota.refusal`` over the rows it locked; ``budget_verdict`` /
``budget_verdict_of`` is the budget's word at submit (held, or never); the dispatch round
reads one view for all its accounts (``round.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any

from sqlalchemy import bindparam, func, null, select, union_all
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.accounts.tree import subtree_names, up_cte
from gateway.domain import quota
from gateway.domain.quota import committed_for, period_start
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


# The pools (cost, whether routable) and the billing weights in one statement: a weight's
# row has its GPU type ("*" for the pool's default), a pool's has none.
_POOLS_AND_WEIGHTS = union_all(
    select(Pool.name, Pool.cost, Pool.configured, Pool.state, null().label("gpu_type"), null().label("weight")),
    select(GpuBillingWeight.pool, null(), null(), null(), GpuBillingWeight.gpu_type, GpuBillingWeight.weight))


def pool_terms(session: Session) -> quota.PoolTerms:
    """Every known pool's cost, the routable ones, the billing weights: one statement."""
    costs: dict[str, float | None] = {}
    routable: list[str] = []
    weights: dict[tuple[str, str], float] = {}
    for name, cost, configured, state, gpu_type, weight in session.execute(_POOLS_AND_WEIGHTS):
        if gpu_type is None:
            costs[name] = cost
            if configured and state == "active":
                routable.append(name)
        else:
            weights[(name, gpu_type)] = float(weight)
    return quota.PoolTerms(costs=costs, routable=tuple(sorted(routable)), weights=weights)


def routable_pools(session: Session) -> list[str]:
    """Pools that may take new jobs now (configured, state ``active``), by name."""
    return list(session.scalars(select(Pool.name).where(Pool.configured.is_(True), Pool.state == "active")
                                .order_by(Pool.name)))


def pool_balances(session: Session, account: str) -> dict[str, int]:
    """GPUs ``account`` and its subtree hold, per pool (pools with a row only)."""
    return {p: int(n) for p, n in session.execute(select(AccountPoolBalance.pool, AccountPoolBalance.reserved_gpus)
                                                  .where(AccountPoolBalance.account_name == account)
                                                  .order_by(AccountPoolBalance.pool))}


def _run_charge(r: Reservation, start: datetime, end: datetime) -> tuple[float, int]:
    """(seconds, GPU-seconds) a run from ``start`` to ``end`` costs, clamped to the time limit and the commitment."""
    seconds = min(max((end - start).total_seconds(), 0.0), float(r.time_limit_s))
    return seconds, min(committed_for(r.gpus, 1, r.billing_weight * seconds) if seconds else 0, r.committed_gpu_seconds)


_CHARGED_SINCE = select(func.coalesce(func.sum(UsageBucket.gpu_seconds), 0)).where(
    UsageBucket.account_name.in_(subtree_names()), UsageBucket.day >= bindparam("since"))


def charged_in_period(session: Session, account_name: str, since: date) -> int:
    """Net charges (usage + debits - credits - refunds) of a subtree since ``since``."""
    return int(session.scalar(_CHARGED_SINCE, {"root": account_name, "since": since}) or 0)


def quota_of(row: Any) -> quota.Quota:
    """An ``account_quota`` row (or any row with its columns) as the rules read it."""
    return quota.Quota(max_gpus=row.max_gpus, budget_gpu_seconds=row.budget_gpu_seconds,
                       budget_period=row.budget_period or "month", budget_window_days=row.budget_window_days or 30)


def charged_of(session: Session, quotas: dict[str, quota.Quota], now: datetime) -> dict[str, int]:
    """What each account with a budget was charged in its budget's current period."""
    return {name: charged_in_period(session, name, period_start(q.budget_period, q.budget_window_days, now))
            for name, q in quotas.items() if q.budget_gpu_seconds is not None}


def read_totals(session: Session, names: Iterable[str], quotas: dict[str, quota.Quota], *,
                now: datetime) -> tuple[dict[str, quota.Held], dict, dict, dict[str, int]]:
    """What the accounts ``names`` hold (balances), their per-pool limits and what they hold
    under them, and what each budget was charged this period: the totals the rules judge.
    Under the chains' locks when the caller holds them (the dispatch round's apply step)."""
    names = sorted(set(names))
    held = {b.account_name: quota.Held(b.reserved_gpus, b.committed_gpu_seconds) for b in session.execute(
        select(AccountBalance.account_name, AccountBalance.reserved_gpus, AccountBalance.committed_gpu_seconds)
        .where(AccountBalance.account_name.in_(names)))}
    limits, used = {}, {}
    for a, p, limit, n in session.execute(
            select(AccountPoolQuota.account_name, AccountPoolQuota.pool, AccountPoolQuota.max_gpus,
                   func.coalesce(AccountPoolBalance.reserved_gpus, 0))
            .outerjoin(AccountPoolBalance, (AccountPoolBalance.account_name == AccountPoolQuota.account_name)
                       & (AccountPoolBalance.pool == AccountPoolQuota.pool))
            .where(AccountPoolQuota.account_name.in_(names), AccountPoolQuota.max_gpus.isnot(None))):
        limits[(a, p)], used[(a, p)] = int(limit), int(n)
    return held, limits, used, charged_of(session, {n: q for n, q in quotas.items() if n in names}, now)


def read_view(session: Session, names: Sequence[str], *, now: datetime,
              pools: quota.PoolTerms | None = None) -> quota.ChainView:
    """The chain ``names`` (root first) as the rules judge it, read without locks."""
    quotas = {q.account_name: quota_of(q) for q in session.scalars(
        select(AccountQuota).where(AccountQuota.account_name.in_(list(names))))}
    held, limits, used, charged = read_totals(session, names, quotas, now=now)
    parent = {n: (names[i - 1] if i else None) for i, n in enumerate(names)}
    return quota.ChainView(parent=parent, quotas=quotas, held=held, pool_limits=limits, pool_held=used,
                           charged=charged, pool_limited=frozenset(a for a, _ in limits),
                           pools=pools if pools is not None else pool_terms(session))


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
    path gets it with its cap check. No read at all when no budget is set (the common case);
    else the pools' terms and each budget's charges, then :func:`quota.budget_verdict`."""
    quotas = {r.name: quota.Quota(budget_gpu_seconds=r.budget_gpu_seconds, budget_period=r.budget_period or "month",
                                  budget_window_days=r.budget_window_days or 30)
              for r in chain if r.budget_gpu_seconds is not None}
    if not quotas:
        return None
    names = [r.name for r in chain]
    view = quota.ChainView(parent={}, quotas=quotas, charged=charged_of(session, quotas, _now(now)),
                           pools=pool_terms(session))
    return quota.budget_verdict(view, names, total_gpus=total_gpus, time_limit_s=time_limit_s, gpu_type=gpu_type)


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
    view = read_view(session, names, now=now)
    gpu_type = normalise_gpu_type(field_of(job, "gpu_type", session))
    weight = view.pools.weight(pool, gpu_type) if pool else view.pools.cheapest(gpu_type)
    gpus = job.total_gpus if gpus is None else gpus
    why = quota.refusal(view, names, gpus=gpus, pools=[pool] if pool else view.pools.routable,
                        committed=committed_for(gpus, job.time_limit_s, weight))
    if why:
        return False, why
    return True, f"fits the quotas of {' > '.join(names)}"


def charged_gpu_seconds(session: Session, *, job_id: str) -> int:
    """Net GPU-seconds charged to one job so far (every run segment, minus refunds)."""
    return int(session.scalar(select(func.coalesce(func.sum(LedgerEntry.gpu_seconds), 0)).where(
        LedgerEntry.job_id == job_id)) or 0)
