"""What the ledger shows: fair share (with guarantees), balances, usage per account and
pool, the last requeue of a job, and ``verify`` (every balance equals the sum of its
entries: must always be empty).
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.domain.fairshare import FairShare, compute_fairshare, decay
from gateway.domain.quota import period_start
from gateway.kit.db import compiled_read
from gateway.kit.timeutil import as_utc
from gateway.ledger.chains import _balance_rows
from gateway.ledger.repository import period_key
from gateway.ledger.rules import _now, charged_in_period, pool_balances
from gateway.models.accounts import Account, AccountPoolQuota, AccountQuota
from gateway.models.ledger import (
    AccountBalance,
    AccountPoolBalance,
    FairshareUsage,
    LedgerEntry,
    Reservation,
    UsageBucket,
)


def fairshare(session: Session, *, now: datetime | None = None, half_life_s: float) -> dict[str, FairShare]:
    """The fair-share factor of every account and its inputs, at ``now``.

    Reads one materialised decayed-usage row per account (not the entries): O(accounts).
    """
    return fairshare_and_guarantees(session, now=now, half_life_s=half_life_s)[0]


def fairshare_and_guarantees(session: Session, *, now: datetime | None = None,
                             half_life_s: float) -> tuple[dict[str, FairShare], dict[str, int], set[str]]:
    """:func:`fairshare`, plus which accounts set a guarantee (docs/recovery.md): each
    account's overall ``guaranteed_gpus`` and the accounts with a per-pool one. One
    statement, which every dispatch round asks (gateway/ledger/guarantees.py reads the rest
    only where a guarantee is set)."""
    now = _now(now)
    h = float(half_life_s)
    tree: dict[str, tuple[str | None, int]] = {}
    own: dict[str, float] = {}
    overall: dict[str, int] = {}
    with_pool: set[str] = set()
    # Usage rows of accounts that no longer exist would count for nothing in compute_fairshare anyway.
    for name, parent, shares, v, at, guaranteed, pool_guaranteed in session.execute(_FAIRSHARE_ROWS):
        tree[name] = (parent, shares)
        if at is not None:
            own[name] = decay(v, as_utc(at), now, h)
        if guaranteed is not None:
            overall[name] = int(guaranteed)
        if pool_guaranteed:
            with_pool.add(name)
    return compute_fairshare(tree, own), overall, with_pool


_FAIRSHARE_ROWS = (select(Account.name, Account.parent_name, Account.shares, FairshareUsage.decayed_gpu_seconds,
                          FairshareUsage.decayed_at, AccountQuota.guaranteed_gpus,
                          select(AccountPoolQuota.account_name).where(
                              AccountPoolQuota.account_name == Account.name,
                              AccountPoolQuota.guaranteed_gpus.is_not(None)).exists())
                   .outerjoin(FairshareUsage, FairshareUsage.account_name == Account.name)
                   .outerjoin(AccountQuota, AccountQuota.account_name == Account.name))


def get_balance(session: Session, account: str) -> AccountBalance:
    rows = _balance_rows(session, [account], lock=False)
    return rows[account]


def balance_of(session: Session, account: str) -> Any:
    """``account``'s balance row to read (its totals as attributes): a statement built once,
    a plain row (issue #46); an account without a row yet gets one as :func:`get_balance` makes it."""
    rows = compiled_read(session, "ledger.balance", _balance).rows(session, {"account": account})
    return rows[0] if rows else get_balance(session, account)


def _balance():
    b = AccountBalance
    return select(b.account_name, b.reserved_gpus, b.committed_gpu_seconds, b.charged_gpu_seconds,
                  b.queued_jobs).where(b.account_name == bindparam("account"))


def usage(session: Session, *, since: date, until: date, period: str = "month",
          account: str | None = None) -> list[dict]:
    """``ledger.repository.usage_report`` (every account, or ``account`` alone) from plain rows of
    a statement built once: the same list (the dashboard's accounts and admin pages, issue #46)."""
    if account is None:
        rows = compiled_read(session, "ledger.usage", lambda: _usage(False)).tuples(
            session, {"since": since, "until": until})
    else:
        rows = compiled_read(session, "ledger.usage_of", lambda: _usage(True)).tuples(
            session, {"since": since, "until": until, "account": account})
    agg: dict[tuple[str, str, str], list[int]] = {}
    for name, day, pool, jobs, used, adjusted, net in rows:
        row = agg.get(key := (name, pool, period_key(day, period)))
        if row is None:
            row = agg[key] = [0, 0, 0, 0]
        row[0] += jobs
        row[1] += used
        row[2] += adjusted
        row[3] += net
    return [{"account": a, "pool": p or None, "period": k, "jobs": v[0], "usage_gpu_seconds": v[1],
             "adjustment_gpu_seconds": v[2], "net_gpu_seconds": v[3], "net_gpu_hours": round(v[3] / 3600, 3)}
            for (a, p, k), v in sorted(agg.items())]


def _usage(one: bool):
    b = UsageBucket
    stmt = select(b.account_name, b.day, b.pool, b.jobs, b.usage_gpu_seconds, b.adjustment_gpu_seconds,
                  b.gpu_seconds).where(b.day >= bindparam("since"), b.day < bindparam("until"))
    return stmt.where(b.account_name == bindparam("account")) if one else stmt


def expected_balances(session: Session) -> dict[str, dict[str, int]]:
    """Running totals recomputed from the entries (and reservations for queued_jobs)."""
    tree = accounts.load_tree(session)
    own: dict[str, dict[str, int]] = {n: dict.fromkeys(
        ("reserved_gpus", "committed_gpu_seconds", "charged_gpu_seconds", "queued_jobs"), 0) for n in tree}
    for acc, pool, g, c, s in session.execute(select(
            LedgerEntry.account_name, LedgerEntry.pool, func.sum(LedgerEntry.gpus),
            func.sum(LedgerEntry.committed_gpu_seconds), func.sum(LedgerEntry.gpu_seconds))
            .group_by(LedgerEntry.account_name, LedgerEntry.pool)):
        if acc not in own:
            continue
        o = own[acc]
        o["reserved_gpus"] += int(g or 0)
        if pool:
            key = f"pool:{pool}"
            o[key] = o.get(key, 0) + int(g or 0)
        o["committed_gpu_seconds"] += int(c or 0)
        o["charged_gpu_seconds"] += int(s or 0)
    for acc, n in session.execute(select(Reservation.account_name, func.count()).where(
            Reservation.status == "reserved").group_by(Reservation.account_name)):
        if acc in own:
            own[acc]["queued_jobs"] += int(n)
    out: dict[str, dict[str, int]] = {}
    for name in tree:
        tot: dict[str, int] = {}
        for d in accounts.descendants(tree, name):
            for k, v in own[d].items():
                tot[k] = tot.get(k, 0) + v
        out[name] = tot
    return out


def verify(session: Session) -> list[str]:
    """Differences between materialised balances and the entries (empty when consistent)."""
    problems = []
    expected = expected_balances(session)
    rows = {b.account_name: b for b in session.scalars(
        select(AccountBalance).execution_options(populate_existing=True))}
    held = {(a, p): int(n) for a, p, n in session.execute(
        select(AccountPoolBalance.account_name, AccountPoolBalance.pool, AccountPoolBalance.reserved_gpus))}
    for name, exp in expected.items():
        b = rows.get(name)
        pools = {k for k in exp if k.startswith("pool:")} | {f"pool:{p}" for a, p in held if a == name}
        for k in [*(k for k in exp if not k.startswith("pool:")), *sorted(pools)]:
            v = exp.get(k, 0)
            if k.startswith("pool:"):
                have = held.get((name, k[5:]), 0)
            else:
                have = getattr(b, k) if b is not None else 0
            if have != v:
                problems.append(f"{name}.{k}: balance {have} != entries {v}")
    return problems


def account_usage(session: Session, *, account: str, now: datetime | None = None,
                  half_life_s: float, shares: dict[str, FairShare] | None = None,
                  pools: bool = True) -> dict[str, Any]:
    """Usage, remaining budget and fair share of one account (for "why is my job waiting").

    ``shares``: every account's fair share (:func:`fairshare`) when the caller already read it
    (the dashboard's accounts page, for each of its accounts: not read again per account);
    ``pools=False``: no per-pool balances (``"pools"`` is None), for a caller that does not
    show them (issue #46)."""
    now = _now(now)
    eff = accounts.effective_quota(session, account)
    bal = balance_of(session, account)
    budget = eff["budget_gpu_seconds"]
    used = remaining = label = None
    if budget.value is not None:
        since = period_start(eff["budget_period"], eff["budget_window_days"], now)
        src_bal = bal if budget.source == account else balance_of(session, budget.source)
        used = charged_in_period(session, budget.source, since)
        remaining = budget.value - used - src_bal.committed_gpu_seconds
        label = now.strftime("%Y-%m") if eff["budget_period"] == "month" else \
            f"last {eff['budget_window_days']} days"
    fs = (fairshare(session, now=now, half_life_s=half_life_s) if shares is None else shares).get(account)
    return {"effective": eff, "balance": bal, "pools": pool_balances(session, account) if pools else None,
            "period": label, "used_gpu_seconds": used,
            "remaining_gpu_seconds": remaining, "fairshare": fs}


def last_requeue_at(session: Session, *, job_id: str) -> datetime | None:
    """When the backend last requeued this job (None if never, or once it finished): no later run starts before it."""
    r = session.get(Reservation, job_id)
    if r is None or r.status == "finished":
        return None
    return as_utc(r.requeued_at)
