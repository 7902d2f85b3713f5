"""Queries over the ledger: filtered entry pages and usage reports."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.accounts.tree import subtree_names
from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.kit.timeutil import utcnow
from gateway.models.ledger import GpuBillingWeight, LedgerEntry, UsageBucket


def list_entries(session: Session, *, account: str | None = None, include_subaccounts: bool = False,
                 job_id: str | None = None, kinds: list[str] | None = None, pool: str | None = None,
                 since: datetime | None = None, until: datetime | None = None, after_id: int = 0,
                 limit: int = 100) -> list[LedgerEntry]:
    stmt = select(LedgerEntry).where(LedgerEntry.id > after_id)
    if account:
        if include_subaccounts:
            stmt = stmt.where(LedgerEntry.account_name.in_(subtree_names(account)))
        else:
            stmt = stmt.where(LedgerEntry.account_name == account)
    if job_id:
        stmt = stmt.where(LedgerEntry.job_id == job_id)
    if kinds:
        stmt = stmt.where(LedgerEntry.kind.in_(kinds))
    if pool:
        stmt = stmt.where(LedgerEntry.pool == pool)
    if since:
        stmt = stmt.where(LedgerEntry.at >= since)
    if until:
        stmt = stmt.where(LedgerEntry.at < until)
    return list(session.scalars(stmt.order_by(LedgerEntry.id).limit(limit)))


def period_key(day: date, period: str) -> str:
    return day.strftime("%Y-%m") if period == "month" else day.isoformat()


def usage_report(session: Session, *, since: date, until: date, period: str = "month",
                 accounts_in: list[str] | None = None) -> list[dict]:
    """Net charges per account (own jobs) x pool x period, from the daily buckets."""
    stmt = select(UsageBucket).where(UsageBucket.day >= since, UsageBucket.day < until)
    if accounts_in is not None:
        stmt = stmt.where(UsageBucket.account_name.in_(accounts_in))
    agg: dict[tuple[str, str, str], dict[str, int]] = defaultdict(
        lambda: {"jobs": 0, "usage_gpu_seconds": 0, "adjustment_gpu_seconds": 0, "net_gpu_seconds": 0})
    for b in session.scalars(stmt):
        row = agg[(b.account_name, b.pool, period_key(b.day, period))]
        row["jobs"] += b.jobs
        row["usage_gpu_seconds"] += b.usage_gpu_seconds
        row["adjustment_gpu_seconds"] += b.adjustment_gpu_seconds
        row["net_gpu_seconds"] += b.gpu_seconds
    return [{"account": a, "pool": p or None, "period": k, **v, "net_gpu_hours": round(v["net_gpu_seconds"] / 3600, 3)}
            for (a, p, k), v in sorted(agg.items())]


def billing_weights(session: Session) -> list[GpuBillingWeight]:
    """Every GPU billing weight, by pool and GPU type."""
    return list(session.scalars(select(GpuBillingWeight).order_by(GpuBillingWeight.pool, GpuBillingWeight.gpu_type)))


def set_billing_weight(session: Session, *, pool: str, gpu_type: str, weight: float, by: Who) -> GpuBillingWeight:
    """Create or change one weight (``gpu_type`` already normalised; ``*`` is the pool's default)."""
    w = session.get(GpuBillingWeight, (pool, gpu_type))
    before = None if w is None else {"weight": w.weight}
    if w is None:
        w = GpuBillingWeight(pool=pool, gpu_type=gpu_type, weight=weight, updated_at=utcnow())
        session.add(w)
    w.weight, w.updated_at = weight, utcnow()
    session.flush()
    audit.record(session, by=by, action="pool.billing_weight.set", target_kind="pool", target_name=f"{pool}/{gpu_type}",
                 before=before, after={"weight": weight})
    return w
