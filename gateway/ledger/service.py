"""The quota ledger: reserve, start, finish, release, admin adjustments, fair share.

Every write follows the same steps, inside the caller's transaction (we only flush):

1. lock the account chain's ``account_balance`` rows, root first (``SELECT ... FOR UPDATE``
   on Postgres; SQLite writers are already serialised by ``BEGIN IMMEDIATE``);
2. read the job's reservation and decide (idempotent: a repeated call is a no-op);
3. append ledger entries and update the running totals of every account in the chain.

Because every writer for an account holds the lock on each ancestor's balance row, two
dispatchers can never both see room for the last gang (docs/ledger.md, "Concurrency").
"""

from __future__ import annotations

import dataclasses
import functools
import math
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import String, bindparam, case, delete, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased, object_session
from sqlalchemy.orm.attributes import set_committed_value

from gateway.accounts import service as accounts
from gateway.accounts.tree import MAX_DEPTH, subtree_names, up_cte
from gateway.domain.fairshare import FairShare, compute_fairshare, decay
from gateway.domain.shapes import normalise_gpu_type
from gateway.kit import bulk
from gateway.kit.errors import Conflict, Invalid, NotFound, QuotaExceeded
from gateway.kit.timeutil import as_utc, utcnow
from gateway.models.accounts import Account, AccountPoolQuota, AccountQuota
from gateway.models.ledger import (
    AccountBalance,
    AccountPoolBalance,
    FairshareUsage,
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


# ----------------------------------------------------------------- locking


def _balance_rows(session: Session, names: list[str], *, lock: bool) -> dict[str, AccountBalance]:
    """Balance rows of ``names`` (in that order: root first), creating missing ones."""
    order = case({n: i for i, n in enumerate(names)}, value=AccountBalance.account_name)
    stmt = (select(AccountBalance).where(AccountBalance.account_name.in_(names)).order_by(order)
            .execution_options(populate_existing=True))
    if lock:
        stmt = stmt.with_for_update()
    rows = {b.account_name: b for b in session.scalars(stmt)}
    missing = [n for n in names if n not in rows]
    if missing:
        # Accounts created before the ledger existed (or by the bootstrap CLI): add the
        # zero row race-free, then lock again.
        _insert_missing_balances(session, missing)
        rows = {b.account_name: b for b in session.scalars(stmt)}
    return rows


def open_account(session: Session, name: str) -> None:
    """A new account's balance row (zero); an account that has one keeps it."""
    _insert_missing_balances(session, [name])


def close_account(session: Session, name: str) -> None:
    """Drop a deleted account's balance rows (its history of entries stays).

    Raises:
        Conflict: the account still holds reservations (reserved or started).
    """
    held = session.scalar(select(func.count()).select_from(Reservation).where(
        Reservation.account_name == name, Reservation.status.in_(["reserved", "started"])))
    if held:
        raise Conflict(f"account {name!r} still holds {held} reservation(s)")
    for model in (AccountBalance, AccountPoolBalance):
        session.execute(delete(model).where(model.account_name == name).execution_options(synchronize_session="fetch"))


def _insert_missing_balances(session: Session, names: list[str]) -> None:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    session.execute(insert(AccountBalance).values([{"account_name": n, "updated_at": utcnow()} for n in names])
                    .on_conflict_do_nothing(index_elements=["account_name"]))


# Built once: rebuilding these recursive statements per call cost ~2 ms of SQLAlchemy
# cache-key work on every reservation (bench/bench_ledger.py).
_UP = up_cte("up")  # the account bound as :leaf and its ancestors (accounts/tree.py)
_CHAIN_NAMES = select(_UP.c.name).order_by(_UP.c.depth.desc())
_CHAIN_ACCOUNT = aliased(Account, name="chain_account")
# How every ledger writer locks an account chain: one statement locks each chain account's
# balance row and its ``account`` row, root first (per row the balance row, then the
# account row: the same order move_subtree uses, so the two cannot deadlock).
#
# Freshness (Postgres, READ COMMITTED): the chain (the recursive CTE) is read from the
# statement's snapshot, which is stale if we waited for a lock held by a re-parent. A
# locked row, though, is returned in its latest committed version, so ``fresh_parent`` is
# the parent *now*, and while we hold the account row (FOR NO KEY UPDATE, which does not
# block foreign-key checks from new jobs) nobody can re-parent it. The locked rows are the
# current chain exactly when their fresh parents link them root to leaf (_chain_complete).
_LOCKED_CHAIN_FROM = (_UP.join(AccountBalance, AccountBalance.account_name == _UP.c.name)
                      .join(_CHAIN_ACCOUNT, _CHAIN_ACCOUNT.name == _UP.c.name))
_LOCK_CHAIN = (select(AccountBalance, _UP.c.name, _CHAIN_ACCOUNT.parent_name.label("fresh_parent"))
               .select_from(_LOCKED_CHAIN_FROM).order_by(_UP.c.depth.desc())
               .with_for_update(of=[AccountBalance, _CHAIN_ACCOUNT], key_share=True)
               .execution_options(populate_existing=True))


class ChainChanged(Conflict):
    """The account tree changed under a ledger write; roll the transaction back and retry.

    Raised instead of locking the new chain while holding the old one's locks, which
    would break the root-first lock order and deadlock with other writers.
    """


def _chain_complete(rows: list) -> bool:
    """The locked rows are the whole current chain: each row's fresh parent is the row before."""
    return bool(rows) and all(r.fresh_parent == (rows[i - 1].name if i else None) for i, r in enumerate(rows))


def _locked_chain_rows(session: Session, account_name: str, execute) -> list:
    """Run a chain-locking statement (``execute()`` -> rows with name, fresh_parent) and check it.

    Balance rows missing for accounts made before the ledger (or by the bootstrap CLI) are
    added once, race-free. Raises NotFound, Conflict (a cycle) or ChainChanged.
    """
    for attempt in range(2):
        rows = execute()
        if _chain_complete(rows):
            return rows
        names = list(session.scalars(_CHAIN_NAMES, {"leaf": account_name}))
        if not names:
            raise NotFound(f"no account {account_name!r}")
        if len(names) > MAX_DEPTH:
            raise Conflict(f"account tree has a cycle above {account_name!r}")
        locked = [r.name for r in rows]
        missing = [n for n in names if n not in locked]
        if attempt == 0 and missing and [n for n in names if n in locked] == locked:
            _insert_missing_balances(session, missing)
            continue
        break
    raise ChainChanged(f"the account tree above {account_name!r} changed while the ledger was being written; retry")


def _lock_chain(session: Session, account_name: str) -> tuple[list[str], dict[str, AccountBalance]]:
    """Lock the chain's balance (and account) rows, root first, in one statement; return (names, rows)."""
    rows = _locked_chain_rows(session, account_name,
                              lambda: session.execute(_LOCK_CHAIN, {"leaf": account_name}).all())
    return [r.name for r in rows], {r.name: r.AccountBalance for r in rows}


# ----------------------------------------------------------------- admission


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


# ----------------------------------------------------------------- writes


def _apply(balances: dict[str, AccountBalance], names: list[str], now: datetime, **deltas: int) -> None:
    """Add ``deltas`` to the chain's running totals in one UPDATE (rows are locked by us)."""
    deltas = {c: d for c, d in deltas.items() if d}
    if not names:
        return
    session = object_session(balances[names[0]])
    values = {c: getattr(AccountBalance, c) + d for c, d in deltas.items()}
    session.execute(update(AccountBalance).where(AccountBalance.account_name.in_(names))
                    .values(**values, updated_at=now).execution_options(synchronize_session=False))
    for n in names:  # keep the loaded objects current without another UPDATE at flush
        b = balances[n]
        for c, d in deltas.items():
            set_committed_value(b, c, getattr(b, c) + d)
        set_committed_value(b, "updated_at", now)


def _apply_pool(session: Session, names: list[str], pool: str, delta: int) -> None:
    """Add ``delta`` GPUs held in ``pool`` to each chain account (one upsert; the chain is locked by us)."""
    if not delta or not names:
        return
    add_pool_deltas(session, {(n, pool): delta for n in names})


def add_pool_deltas(session: Session, deltas: dict[tuple[str, str], int]) -> None:
    """Add GPUs held per (account, pool) in one upsert (the accounts' chains are locked by us)."""
    deltas = {k: d for k, d in deltas.items() if d}
    if not deltas:
        return
    rows = [{"account_name": n, "pool": p, "reserved_gpus": d} for (n, p), d in deltas.items()]
    if session.get_bind().dialect.name == "postgresql":
        # One JSON document, one cached statement: SQLAlchemy compiles a multi-VALUES insert
        # anew every time ("no key"), and a dispatch round upserts a row per chain account and pool.
        if session.autoflush:  # as the ORM statement it replaces did
            session.flush()
        session.connection().execute(_ADD_POOL_DELTAS_PG, {"rows": bulk.document(rows)})
        return
    from sqlalchemy.dialects.sqlite import insert

    stmt = insert(AccountPoolBalance).values(rows)
    session.execute(stmt.on_conflict_do_update(
        index_elements=["account_name", "pool"],
        set_={"reserved_gpus": AccountPoolBalance.reserved_gpus + stmt.excluded.reserved_gpus}))


def _add_pool_deltas_pg():
    from sqlalchemy.dialects.postgresql import insert

    table = AccountPoolBalance.__table__
    cols = ("account_name", "pool", "reserved_gpus")
    rec = bulk.recordset(table, cols)
    stmt = insert(table).from_select(list(cols), select(*(rec.c[c] for c in cols)))
    return stmt.on_conflict_do_update(index_elements=["account_name", "pool"],
                                      set_={"reserved_gpus": table.c.reserved_gpus + stmt.excluded.reserved_gpus})


_ADD_POOL_DELTAS_PG = _add_pool_deltas_pg()


def _entry(session: Session, **kw: Any) -> LedgerEntry:
    e = LedgerEntry(**kw)
    session.add(e)
    return e


_WEIGHT = select(GpuBillingWeight.weight).where(GpuBillingWeight.pool == bindparam("pool"),
                                                 GpuBillingWeight.gpu_type == bindparam("gpu_type")).scalar_subquery()
_DEFAULT_WEIGHT = select(GpuBillingWeight.weight).where(GpuBillingWeight.pool == bindparam("pool"),
                                                         GpuBillingWeight.gpu_type == "*").scalar_subquery()
_POOL_COST = select(Pool.cost).where(Pool.name == bindparam("pool")).scalar_subquery()
_BALANCE_COLS = ("reserved_gpus", "committed_gpu_seconds", "charged_gpu_seconds", "queued_jobs")
_QUOTA_COLS = ("max_gpus", "budget_gpu_seconds", "budget_period", "budget_window_days")
# Per-pool limit and GPUs held in the reserving pool, per chain account (NULL: no limit /
# no row). The balance row is written under the chain's lock, like account_balance.
_POOL_LIMIT = select(AccountPoolQuota.max_gpus).where(
    AccountPoolQuota.account_name == _UP.c.name, AccountPoolQuota.pool == bindparam("pool")).scalar_subquery()
_POOL_HELD = select(AccountPoolBalance.reserved_gpus).where(
    AccountPoolBalance.account_name == _UP.c.name, AccountPoolBalance.pool == bindparam("pool")).scalar_subquery()
# The reservation's one read: the chain locked as in _LOCK_CHAIN, plus what the admission
# rule needs (each account's quota, the job's reservation, the billing weight). Postgres
# refuses FOR UPDATE on the nullable side of an outer join; the quota side is not locked.
_RESERVE_LOCK = (
    select(_UP.c.name, _CHAIN_ACCOUNT.parent_name.label("fresh_parent"),
           AccountQuota.account_name.label("has_quota"),
           *[getattr(AccountBalance, c) for c in _BALANCE_COLS], *[getattr(AccountQuota, c) for c in _QUOTA_COLS],
           select(Reservation.status).where(Reservation.job_id == bindparam("job_id")).scalar_subquery()
           .label("r_status"),
           select(Reservation.pool).where(Reservation.job_id == bindparam("job_id")).scalar_subquery()
           .label("r_pool"),
           func.coalesce(_WEIGHT, _DEFAULT_WEIGHT, _POOL_COST, 1.0).label("weight"),
           select(Pool.name).where(Pool.name == bindparam("pool")).scalar_subquery().label("pool_known"),
           _POOL_LIMIT.label("pool_limit"), _POOL_HELD.label("pool_held"))
    .select_from(_LOCKED_CHAIN_FROM.outerjoin(AccountQuota, AccountQuota.account_name == _UP.c.name))
    .order_by(_UP.c.depth.desc())
    .with_for_update(of=[AccountBalance, _CHAIN_ACCOUNT], key_share=True)
)
_BALANCE_T = AccountBalance.__table__


def reserve(session: Session, *, job: Any, pool: str, actor: str, now: datetime | None = None,
            gpus: int | None = None) -> None:
    """Reserve the whole gang's GPUs and committed GPU-time on the job's account chain.

    Nothing is written when the gang does not fit, so a caller needs no savepoint to go on
    after a refusal.

    Args:
        job: the job being dispatched to ``pool``.
        pool: the pool's name (a row of the ``pool`` table).
        actor: who dispatches (e.g. "system:dispatcher").
        gpus: the GPUs the gang holds in ``pool``, reserved, limited and later charged (on a
            node-exclusive pool whole nodes x GPUs per node; docs/ledger.md); at least
            ``job.total_gpus``, the default.

    Raises:
        QuotaExceeded: the gang does not fit; nothing was written.
        Conflict: the job already finished, or holds a reservation in another pool.
    """
    now = _now(now)
    if job.total_gpus < 0 or job.time_limit_s <= 0:
        raise Invalid("job", "total_gpus must be >= 0 and time_limit_s > 0")
    # Never less than asked: a caller cannot make a gang cheaper than its request.
    held = job.total_gpus if gpus is None else max(int(gpus), job.total_gpus)
    # Hot path (bench/bench_ledger.py): Core statements, two round trips while the chain is
    # locked (three with a GPU-hour budget in the chain), instead of ORM objects; the write
    # is the dispatch round's (write_reservations), a batch of one.
    conn = session.connection()
    gpu_type = normalise_gpu_type(field_of(job, "gpu_type", session))
    params = {"leaf": job.account_name, "job_id": job.id, "pool": pool, "gpu_type": gpu_type or "*"}
    rows = _locked_chain_rows(session, job.account_name, lambda: conn.execute(_RESERVE_LOCK, params).all())
    names = [r.name for r in rows]
    r_status, r_pool, weight = rows[0].r_status, rows[0].r_pool, float(rows[0].weight)
    if rows[0].pool_known is None:
        require_known(session, pool, "pool")
    if not _again_or_refuse(r_status, r_pool, job.id, pool):
        return
    balances = {r.name: _BalanceView(**{c: getattr(r, c) for c in _BALANCE_COLS}) for r in rows}
    quotas = {r.name: _QuotaView(**{c: getattr(r, c) for c in _QUOTA_COLS}) for r in rows if r.has_quota}
    committed = committed_for(held, job.time_limit_s, weight)
    pool_limits = {(r.name, pool): (r.pool_limit, r.pool_held or 0) for r in rows if r.pool_limit is not None}
    why = _refusal(session, names=names, balances=balances, gpus=held, pool=pool,
                   committed=committed, now=now, quotas=quotas, pool_limits=pool_limits)
    if why:
        raise QuotaExceeded(why)
    row, entry = reserve_rows(job=job, pool=pool, gpu_type=gpu_type, held=held, weight=weight,
                              committed=committed, actor=actor, now=now)
    write_reservations(session, [ReservationWrite(job, pool, tuple(names), row, entry)], now=now)


def reserve_rows(*, job: Any, pool: str, gpu_type: str | None, held: int, weight: float, committed: int,
                 actor: str, now: datetime) -> tuple[dict[str, Any], dict[str, Any]]:
    """(reservation row, ``reserve`` ledger entry) of one admitted gang: one definition for
    :func:`reserve` and the dispatch round's batch (gateway/ledger/round.py)."""
    row = dict(job_id=job.id, account_name=job.account_name, username=job.username, pool=pool, gpu_type=gpu_type,
               gpus=held, time_limit_s=job.time_limit_s, billing_weight=weight,
               committed_gpu_seconds=committed, status="reserved", reserved_at=now, started_at=None,
               ended_at=None, used_gpu_seconds=0, accrued_gpu_seconds=0, accrued_at=None, requeued_at=None)
    why_held = "" if held == job.total_gpus else \
        f" (whole nodes: {job.workers} x {held // job.workers} GPUs; asked {job.total_gpus})"
    entry = dict(at=now, account_name=job.account_name, kind="reserve", job_id=job.id, pool=pool,
                 gpu_type=gpu_type, username=job.username, gpus=held,
                 committed_gpu_seconds=committed, gpu_seconds=0, billing_weight=weight, actor=actor,
                 reason=f"{held} GPUs{why_held} x {job.time_limit_s} s x weight {weight:g}")
    return row, entry


@functools.lru_cache(maxsize=8)
def _flush_sql(dialect, res_cols: tuple[str, ...], entry_cols: tuple[str, ...]) -> Any:
    """Postgres: reservations (one job's or a dispatch round's) in one statement.

    ``:rows`` holds one record per job: its reservation row (``res_cols``, as
    :func:`ledger.reserve_rows` makes it), its entry (``e_`` + ``entry_cols``), its chain
    (root first) and its place in the round. The reservation is inserted, or written again
    over a released one (``ON CONFLICT ... WHERE.status = 'released'``); a job that holds
    one already is left out of everything (RETURNING tells the caller which were written).
    For the written ones: the entries in the round's order, the deltas added to every chain
    account's balance, and the GPUs held per chain account and pool upserted. The chains'
    balance rows are locked by the caller first, root-first.
    """
    from sqlalchemy import text

    res_t, entry_t = Reservation.__table__, LedgerEntry.__table__
    quote = dialect.identifier_preparer.quote

    def typed(table, names, prefix=""):
        return ", ".join(f"{quote(prefix + n)} {table.c[n].type.compile(dialect=dialect)}" for n in names)

    cols = ", ".join(quote(c) for c in res_cols)
    return text(f"""
WITH r AS (SELECT * FROM json_to_recordset(CAST(:rows AS json))
           AS r({typed(res_t, res_cols)}, {typed(entry_t, entry_cols, "e_")}, chain text[], ord integer)),
written AS (
    INSERT INTO {quote(res_t.name)} ({cols}) SELECT {", ".join(f"r.{quote(c)}" for c in res_cols)} FROM r ORDER BY r.ord
    ON CONFLICT (job_id) DO UPDATE SET {", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in res_cols if c != "job_id")}
    WHERE {quote(res_t.name)}.status = 'released'
    RETURNING job_id),
ok AS (SELECT r.* FROM r JOIN written ON written.job_id = r.job_id),
entries AS (
    INSERT INTO {quote(entry_t.name)} ({", ".join(quote(c) for c in entry_cols)})
    SELECT {", ".join(f"ok.{quote('e_' + c)}" for c in entry_cols)} FROM ok ORDER BY ok.ord),
up AS (SELECT c.name AS account_name, ok.pool, ok.gpus, ok.committed_gpu_seconds
       FROM ok CROSS JOIN LATERAL unnest(ok.chain) AS c(name)),
balances AS (
    UPDATE account_balance SET reserved_gpus = account_balance.reserved_gpus + d.g,
        committed_gpu_seconds = account_balance.committed_gpu_seconds + d.c,
        queued_jobs = account_balance.queued_jobs + d.q, updated_at = :b_now
    FROM (SELECT account_name, sum(gpus) AS g, sum(committed_gpu_seconds) AS c, count(*) AS q
          FROM up GROUP BY account_name) AS d
    WHERE account_balance.account_name = d.account_name),
per_pool AS (
    INSERT INTO account_pool_balance (account_name, pool, reserved_gpus)
    SELECT account_name, pool, sum(gpus) FROM up WHERE gpus <> 0 GROUP BY account_name, pool
    ON CONFLICT (account_name, pool)
    DO UPDATE SET reserved_gpus = account_pool_balance.reserved_gpus + EXCLUDED.reserved_gpus)
SELECT job_id FROM written""")

# The reservations a round's jobs already have: ``= ANY(array)`` on Postgres, one parameter
# whatever the batch size (an expanding IN binds, and renders, one per job).
_HAVE_PG = select(Reservation.job_id, Reservation.status, Reservation.pool).where(
    Reservation.job_id == func.any(bindparam("ids", type_=ARRAY(String))))

_DELTA_COLS = ("reserved_gpus", "committed_gpu_seconds", "queued_jobs")
_ADD_DELTAS = (
    _BALANCE_T.update().where(_BALANCE_T.c.account_name == bindparam("b_name"))
    .values(**{c: _BALANCE_T.c[c] + bindparam(f"d_{c}") for c in _DELTA_COLS}, updated_at=bindparam("b_now"))
)


@dataclasses.dataclass(frozen=True)
class ReservationWrite:
    """One admitted gang's reservation, ready to write: its rows (:func:`reserve_rows`) and its
    chain, root first."""

    job: Any
    pool: str
    names: tuple[str, ...]
    row: dict[str, Any]
    entry: dict[str, Any]


def write_reservations(session: Session, items: list[ReservationWrite], *, now: datetime) -> None:
    """THE writer of reservations: :func:`reserve`'s one job and a dispatch round's many.

    The caller has locked every chain's balance rows, root first, and decided (the
    per-job rule, or a chain without limits: gateway/ledger/round.py). Writes the
    reservations (or again over released ones), their entries, the chains' balance
    deltas and per-pool rows; a job that already holds the same reservation is skipped
    (idempotent), one holding another is a Conflict. Postgres: one statement; else one
    per table.
    """
    if not items:
        return
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        _write_pg(conn, items, now)
    else:
        _write(session, conn, items, now)
    touched = {n for it in items for n in it.names}
    ids = {it.job.id for it in items}
    for obj in list(session.identity_map.values()):  # Core writes: drop stale copies
        if (isinstance(obj, (AccountBalance, AccountPoolBalance)) and obj.account_name in touched) or (
                isinstance(obj, Reservation) and obj.job_id in ids):
            session.expire(obj)


def _again_or_refuse(status: str | None, r_pool: str | None, job_id: str, pool: str) -> bool:
    """What reserving does with a job that has a reservation row (``status``): False to
    skip it (reserved or started in the same pool: idempotent), True to reserve again
    (none yet, or released earlier, e.g. a submission the backend refused); a Conflict otherwise."""
    if status in ("reserved", "started"):
        if r_pool != pool:
            raise Conflict(f"job {job_id} already holds a reservation in pool {r_pool}")
        return False
    if status == "finished":
        raise Conflict(f"job {job_id} already finished; it cannot reserve again")
    return True


def _write_pg(conn, items: list[ReservationWrite], now: datetime) -> None:
    """Postgres: the reservations, their entries, the chains' balance deltas and per-pool
    rows in ONE statement (``_flush_sql``); only the jobs whose reservation row was
    written (new, or released before) count. A job left out already had a reservation:
    skipped when it is the same one (reserve() is idempotent), else a Conflict."""
    doc = [{**it.row, **{f"e_{k}": v for k, v in it.entry.items()}, "chain": list(it.names), "ord": i}
           for i, it in enumerate(items)]
    sql = _flush_sql(conn.dialect, tuple(items[0].row), tuple(items[0].entry))
    written = set(conn.execute(sql, {"rows": bulk.document(doc), "b_now": now}).scalars())
    left = [it for it in items if it.job.id not in written]
    if left:
        have = {j: (st, p) for j, st, p in conn.execute(_HAVE_PG, {"ids": [it.job.id for it in left]})}
        for it in left:
            if _again_or_refuse(*have.get(it.job.id, (None, None)), it.job.id, it.pool):
                raise Conflict(f"job {it.job.id}: its reservation changed during the dispatch round; retry")


def _write(session: Session, conn, items: list[ReservationWrite], now: datetime) -> None:
    """SQLite: the reservations a round's jobs already have read first, then one statement per table."""
    ids = [it.job.id for it in items]
    have = {j: (st, p) for j, st, p in conn.execute(
        select(Reservation.job_id, Reservation.status, Reservation.pool).where(Reservation.job_id.in_(ids)))}
    new_rows, again, entries = [], [], []
    deltas: dict[str, list[int]] = {}
    pool_deltas: dict[tuple[str, str], int] = {}
    for it in items:
        status, r_pool = have.get(it.job.id, (None, None))
        if status is not None and not _again_or_refuse(status, r_pool, it.job.id, it.pool):
            continue
        (again if status is not None else new_rows).append(it.row)
        entries.append(it.entry)
        for n in it.names:
            d = deltas.setdefault(n, [0, 0, 0])
            d[0] += it.row["gpus"]
            d[1] += it.row["committed_gpu_seconds"]
            d[2] += 1
            if it.row["gpus"]:
                pool_deltas[(n, it.pool)] = pool_deltas.get((n, it.pool), 0) + it.row["gpus"]
    reservation_t = Reservation.__table__
    bulk.insert_rows(conn, reservation_t, new_rows)
    for row in again:  # released earlier (e.g. a submission the backend refused): reserve again
        conn.execute(reservation_t.update().where(reservation_t.c.job_id == row["job_id"]), row)
    bulk.insert_rows(conn, LedgerEntry.__table__, entries)
    if deltas:
        conn.execute(_ADD_DELTAS, [{"b_name": n, "b_now": now, **{f"d_{c}": v for c, v in zip(_DELTA_COLS, d, strict=True)}}
                                   for n, d in deltas.items()])
    if pool_deltas:
        add_pool_deltas(session, pool_deltas)


@dataclasses.dataclass(frozen=True)
class _BalanceView:
    reserved_gpus: int = 0
    committed_gpu_seconds: int = 0
    charged_gpu_seconds: int = 0
    queued_jobs: int = 0


_ZERO = _BalanceView()


@dataclasses.dataclass(frozen=True)
class _QuotaView:
    max_gpus: int | None
    budget_gpu_seconds: int | None
    budget_period: str
    budget_window_days: int


def _locked_reservation(session: Session, job: Any) -> tuple[list[str], dict[str, AccountBalance], Reservation | None]:
    r0 = session.get(Reservation, job.id)
    account = r0.account_name if r0 is not None else job.account_name
    names, balances = _lock_chain(session, account)
    r = session.scalars(select(Reservation).where(Reservation.job_id == job.id)
                        .execution_options(populate_existing=True)).first()
    return names, balances, r


def record_start(session: Session, *, job: Any, started_at: datetime, actor: str) -> None:
    """Mark the reservation as running (no longer queued). Idempotent per job.

    Raises:
        Conflict: the job has no reservation (it was never reserved, or was released).
    """
    started_at = as_utc(started_at)
    names, balances, r = _locked_reservation(session, job)
    if r is None or r.status == "released":
        raise Conflict(f"job {job.id} holds no reservation; reserve it before it starts")
    if r.status != "reserved":
        return
    r.status, r.started_at = "started", started_at
    _entry(session, at=started_at, account_name=r.account_name, kind="start", job_id=job.id, pool=r.pool,
           gpu_type=r.gpu_type, username=r.username, gpus=0, committed_gpu_seconds=0, gpu_seconds=0,
           billing_weight=r.billing_weight, actor=actor, reason="whole gang started")
    _apply(balances, names, utcnow(), queued_jobs=-1)
    session.flush()


def record_finish(session: Session, *, job: Any, started_at: datetime | None, ended_at: datetime, actor: str,
                  half_life_s: float, retried: bool = False) -> int:
    """Charge the real usage and release the rest of the reservation. Idempotent per job.

    used = total_gpus x clamp(ended - started, 0, time_limit_s) x billing weight (0 if never
    started). A job without a reservation (cancelled while pending) is a no-op.

    ``retried``: only this attempt ended, and the gateway runs the job again
    (docs/recovery.md): the run is charged the same way, and the reservation is left
    ``released``, so that the next attempt is admitted afresh (budgets, quotas) in whatever
    pool it goes to. Returns the GPU-seconds the run was charged in all (accruals included).
    """
    ended_at = as_utc(ended_at)
    names, balances, r = _locked_reservation(session, job)
    if r is None or r.status in ("finished", "released"):
        return 0
    was_queued = r.status == "reserved"
    started = as_utc(started_at) or as_utc(r.started_at)
    used = 0
    if started is not None:
        _, used = _run_charge(r, started, ended_at)
    # What this run was charged already while it ran (accrue_usage); the rest is charged now.
    # Negative when the backend reports an end earlier than the last accrual: a correction.
    accrued = (r.accrued_gpu_seconds or 0) if not was_queued else 0
    charge = used - accrued
    # += : a requeued job was charged its earlier run segments already (record_requeue).
    r.status, r.ended_at, r.used_gpu_seconds = ("released" if retried else "finished"), ended_at, \
        r.used_gpu_seconds + used
    if started is not None and r.started_at is None:
        r.started_at = started
    if started is not None:
        ran = f"ran {int((ended_at - started).total_seconds())} s on {r.gpus} GPUs"
        _entry(session, at=ended_at, account_name=r.account_name, kind="usage", job_id=job.id, pool=r.pool,
               gpu_type=r.gpu_type, username=r.username, gpus=0, committed_gpu_seconds=-charge, gpu_seconds=charge,
               billing_weight=r.billing_weight, actor=actor,
               reason=f"{ran} ({accrued} GPU-s of it charged while running)" if accrued else ran,
               data={"started_at": started.isoformat(), "ended_at": ended_at.isoformat(), "accrued": accrued})
    rest = r.committed_gpu_seconds - used
    _entry(session, at=ended_at, account_name=r.account_name, kind="release", job_id=job.id, pool=r.pool,
           gpu_type=r.gpu_type, username=r.username, gpus=-r.gpus, committed_gpu_seconds=-rest, gpu_seconds=0,
           billing_weight=r.billing_weight, actor=actor,
           reason=("attempt ended, the job runs again; " if retried else "job ended; ")
           + ("unused committed time returned" if started else "it never started"))
    _apply(balances, names, utcnow(), reserved_gpus=-r.gpus, committed_gpu_seconds=-(r.committed_gpu_seconds - accrued),
           charged_gpu_seconds=charge, queued_jobs=-1 if was_queued else 0)
    _apply_pool(session, names, r.pool, -r.gpus)
    # A job counts once, in the bucket of the day it ends: not at an attempt that is retried.
    ended_jobs = 0 if retried else 1
    if charge:
        _add_bucket(session, r.account_name, ended_at.date(), r.pool, charge, usage=charge, jobs=ended_jobs)
        _add_decayed_usage(session, r.account_name, charge, ended_at, float(half_life_s))
    elif used and ended_jobs:
        _add_bucket(session, r.account_name, ended_at.date(), r.pool, 0, usage=0, jobs=1)
    session.flush()
    return used


def accrue_usage(session: Session, *, job: Any, now: datetime, actor: str, half_life_s: float) -> int:
    """Charge a running gang's usage so far, so budgets and fair share see long jobs as they run.

    Slurm accrues usage every PriorityCalcPeriod; without this, a three-day job would count
    for nothing in its team's fair share until it ended. The charge moves GPU-seconds from the
    job's commitment to its usage (a ``usage`` entry), so charged + committed is unchanged and
    no quota check moves. :func:`record_finish` and :func:`record_requeue` later charge only
    the rest of the run. Idempotent: returns the GPU-seconds newly charged (0 when the job is
    not running or nothing new has accrued).
    """
    now = as_utc(now)
    names, balances, r = _locked_reservation(session, job)
    if r is None or r.status != "started" or r.started_at is None:
        return 0
    started = as_utc(r.started_at)
    seconds, used_now = _run_charge(r, started, now)
    delta = used_now - (r.accrued_gpu_seconds or 0)
    if delta <= 0:
        return 0
    _entry(session, at=now, account_name=r.account_name, kind="usage", job_id=job.id, pool=r.pool,
           gpu_type=r.gpu_type, username=r.username, gpus=0, committed_gpu_seconds=-delta, gpu_seconds=delta,
           billing_weight=r.billing_weight, actor=actor,
           reason=f"running for {int(seconds)} s on {r.gpus} GPUs (charged while running)",
           data={"started_at": started.isoformat(), "until": now.isoformat(), "accrual": True})
    r.accrued_gpu_seconds, r.accrued_at = (r.accrued_gpu_seconds or 0) + delta, now
    _apply(balances, names, utcnow(), committed_gpu_seconds=-delta, charged_gpu_seconds=delta)
    _add_bucket(session, r.account_name, now.date(), r.pool, delta, usage=delta)
    _add_decayed_usage(session, r.account_name, delta, now, float(half_life_s))
    session.flush()
    return delta


def release(session: Session, *, job: Any, actor: str, reason: str) -> None:
    """Give back the reservation of a job that never started. Idempotent.

    Raises:
        Conflict: the job has started; use :func:`record_finish`.
    """
    names, balances, r = _locked_reservation(session, job)
    if r is None or r.status in ("released", "finished"):
        return
    if r.status == "started":
        raise Conflict(f"job {job.id} has started; its reservation ends with record_finish")
    now = utcnow()
    r.status, r.ended_at = "released", now
    _entry(session, at=now, account_name=r.account_name, kind="release", job_id=job.id, pool=r.pool,
           gpu_type=r.gpu_type, username=r.username, gpus=-r.gpus, committed_gpu_seconds=-r.committed_gpu_seconds,
           gpu_seconds=0, billing_weight=r.billing_weight, actor=actor, reason=reason or "released")
    _apply(balances, names, now, reserved_gpus=-r.gpus, committed_gpu_seconds=-r.committed_gpu_seconds,
           queued_jobs=-1)
    _apply_pool(session, names, r.pool, -r.gpus)
    session.flush()


def adjust(session: Session, *, account: str, kind: str, gpu_seconds: int, actor: str, reason: str,
           job_id: str | None = None, pool: str | None = None, now: datetime | None = None) -> LedgerEntry:
    """An admin credit (gives budget back), debit (takes budget) or refund of a job's usage.

    Raises:
        Invalid: bad kind/amount/pool, a refund without a finished job, or more than was charged.
    """
    now = _now(now)
    if kind not in ("credit", "debit", "refund"):
        raise Invalid("body.kind", "must be credit, debit or refund")
    if not isinstance(gpu_seconds, int) or gpu_seconds <= 0 or gpu_seconds > 10**15:
        raise Invalid("body.gpu_seconds", "must be a positive whole number of GPU-seconds (at most 1e15)")
    if not reason or not reason.strip():
        raise Invalid("body.reason", "say why: the reason is kept in the ledger")
    if pool is not None:
        require_known(session, pool, "body.pool")
    accounts.get_or_raise(session, name=account, field="body.account")
    names, balances = _lock_chain(session, account)
    if kind == "refund":
        if job_id is None:
            raise Invalid("body.job_id", "a refund names the job whose usage it gives back")
        r = session.get(Reservation, job_id)
        if r is None or r.status != "finished" or r.account_name != account:
            raise Invalid("body.job_id", f"job {job_id!r} has no finished usage on account {account!r}")
        refunded = -int(session.scalar(select(func.coalesce(func.sum(LedgerEntry.gpu_seconds), 0)).where(
            LedgerEntry.job_id == job_id, LedgerEntry.kind == "refund")) or 0)
        if refunded + gpu_seconds > r.used_gpu_seconds:
            raise Invalid("body.gpu_seconds", f"job {job_id} was charged {r.used_gpu_seconds} GPU-seconds and "
                                              f"{refunded} were refunded already")
        pool = pool or r.pool
    signed = gpu_seconds if kind == "debit" else -gpu_seconds
    e = _entry(session, at=now, account_name=account, kind=kind, job_id=job_id, pool=pool, gpus=0,
               committed_gpu_seconds=0, gpu_seconds=signed, billing_weight=1.0, actor=actor, reason=reason.strip())
    _apply(balances, names, now, charged_gpu_seconds=signed)
    _add_bucket(session, account, now.date(), pool or "", signed, adjustment=signed)
    session.flush()
    return e


def _add_bucket(session: Session, account: str, day: date, pool: str, gpu_seconds: int, *, usage: int = 0,
                adjustment: int = 0, jobs: int = 0) -> None:
    # Only ever called with the account's chain locked, so select-then-write is race-free.
    b = session.get(UsageBucket, (account, day, pool))
    if b is None:
        b = UsageBucket(account_name=account, day=day, pool=pool, gpu_seconds=0, usage_gpu_seconds=0,
                        adjustment_gpu_seconds=0, jobs=0)
        session.add(b)
    b.gpu_seconds += gpu_seconds
    b.usage_gpu_seconds += usage
    b.adjustment_gpu_seconds += adjustment
    b.jobs += jobs


def _add_decayed_usage(session: Session, account: str, gpu_seconds: float, at: datetime, half_life_s: float) -> None:
    row = session.get(FairshareUsage, account)
    if row is None:
        session.add(FairshareUsage(account_name=account, decayed_gpu_seconds=float(gpu_seconds), decayed_at=at))
        return
    last = as_utc(row.decayed_at)
    if at >= last:
        row.decayed_gpu_seconds = decay(row.decayed_gpu_seconds, last, at, half_life_s) + gpu_seconds
        row.decayed_at = at
    else:  # usage reported late: decay it to the row's reference time instead
        row.decayed_gpu_seconds += decay(gpu_seconds, at, last, half_life_s)


def move_subtree(session: Session, *, account: str, new_parent: str | None, actor: str) -> None:
    """Re-parent ``account``: its subtree totals leave the old ancestors and join the new ones."""
    old = [a.name for a in accounts.chain(session, account)][:-1]
    new = [a.name for a in accounts.chain(session, new_parent)] if new_parent else []
    depth = {n: i for i, n in enumerate(old)}
    depth.update({n: i for i, n in enumerate(new)})
    depth[account] = len(old)
    # One global lock order (depth, then name) that agrees with every chain's root->leaf order.
    order = sorted(depth, key=lambda n: (depth[n], n))
    rows = _balance_rows(session, order, lock=True)
    moving = rows[account]
    cols = ("reserved_gpus", "committed_gpu_seconds", "charged_gpu_seconds", "queued_jobs")
    now = utcnow()
    held = pool_balances(session, account)
    for sign, names in ((-1, old), (1, new)):
        _apply(rows, names, now, **{c: sign * getattr(moving, c) for c in cols})
        for pool, n in held.items():
            _apply_pool(session, names, pool, sign * n)
    acc = session.get(Account, account)
    acc.parent_name = new_parent
    session.flush()


# ----------------------------------------------------------------- reading


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
                  half_life_s: float) -> dict[str, Any]:
    """Usage, remaining budget and fair share of one account (for "why is my job waiting")."""
    now = _now(now)
    eff = accounts.effective_quota(session, account)
    bal = get_balance(session, account)
    budget = eff["budget_gpu_seconds"]
    used = remaining = label = None
    if budget.value is not None:
        since = period_start(eff["budget_period"], eff["budget_window_days"], now)
        src_bal = get_balance(session, budget.source)
        used = charged_in_period(session, budget.source, since)
        remaining = budget.value - used - src_bal.committed_gpu_seconds
        label = now.strftime("%Y-%m") if eff["budget_period"] == "month" else \
            f"last {eff['budget_window_days']} days"
    fs = fairshare(session, now=now, half_life_s=half_life_s).get(account)
    return {"effective": eff, "balance": bal, "pools": pool_balances(session, account), "period": label, "used_gpu_seconds": used,
            "remaining_gpu_seconds": remaining, "fairshare": fs}


# ----------------------------------------------------------------- requeues


@dataclasses.dataclass(frozen=True)
class Requeued:
    """What :func:`requeue` did."""

    charged_gpu_seconds: int  # the segment's GPU-seconds (0 when nothing was charged)
    over_budget: str | None = None  # why the job may not run again (it must be cancelled), else None


def record_requeue(session: Session, *, job: Any, started_at: datetime | None, requeued_at: datetime, actor: str,
                   half_life_s: float, now: datetime | None = None) -> int:
    """:func:`requeue`, returning only the segment's GPU-seconds (the re-admission still applies)."""
    return requeue(session, job=job, started_at=started_at, requeued_at=requeued_at, actor=actor,
                   half_life_s=half_life_s, now=now).charged_gpu_seconds


def _requeue_refusal(session: Session, *, names: list[str], balances: dict[str, AccountBalance], r: Reservation,
                     held: int, charge: int, charged_on: date, now: datetime) -> str | None:
    """Why the job's whole commitment no longer fits a GPU-hour budget of its chain, or None.

    ``held`` is what the job holds of the chain's commitment now; ``charge`` is about to be
    charged on ``charged_on``. Only budgets are checked again: the gang's GPUs and its queue
    slot never left the ledger (the backend kept it queued), a new run's committed time did.
    """
    quotas = {q.account_name: q for q in session.scalars(select(AccountQuota).where(
        AccountQuota.account_name.in_(names), AccountQuota.budget_gpu_seconds.is_not(None)))}
    for name in reversed(names):
        q = quotas.get(name)
        if q is None:
            continue
        since = period_start(q.budget_period, q.budget_window_days, now)
        used = charged_in_period(session, name, since) + (charge if charged_on >= since else 0)
        others = balances[name].committed_gpu_seconds - held
        if used + others + r.committed_gpu_seconds > q.budget_gpu_seconds:
            return (f"{name}: GPU-hour budget {period_label(q.budget_period, q.budget_window_days)}: "
                    f"{_hours(used)} used + {_hours(others)} committed of {_hours(q.budget_gpu_seconds)} "
                    f"GPU-hours, another run needs {_hours(r.committed_gpu_seconds)}")
    return None


def requeue(session: Session, *, job: Any, started_at: datetime | None, requeued_at: datetime, actor: str,
            half_life_s: float, now: datetime | None = None) -> Requeued:
    """Charge the segment a gang ran before the backend requeued it, and re-admit it.

    The gang held its GPUs from ``started_at`` to ``requeued_at``: that segment is charged
    now (a ``usage`` entry) so the time it then spends waiting in the backend's queue is
    never charged. The reservation goes back to ``reserved`` (queued) and keeps its GPUs.
    The next run may use the full time limit again (Slurm and Kueue both restart a requeued
    job from scratch), so its whole committed GPU-time is admitted again against the GPU-hour
    budgets of the chain, as :func:`reserve` would:

    * it fits: the commitment is whole again; the next :func:`record_start` records the new
      start and :func:`record_finish` charges only the last segment;
    * it does not: ``over_budget`` says why, and the reservation keeps only what is left of
      the admission it ran under (committed minus this segment), so the budget holds even if
      the backend restarts the gang before the caller's cancel reaches it.

    Idempotent: a reservation that is not ``started`` is left alone.

    Args:
        job: the requeued job.
        started_at: when the segment started (defaults to the reservation's start).
        requeued_at: when the backend took the gang down.
        actor: who observed the requeue (e.g. "system:reconciler").
        now: the time of the re-admission (budget period); defaults to ``requeued_at``.
    """
    requeued_at = as_utc(requeued_at)
    now = as_utc(now) or requeued_at
    names, balances, r = _locked_reservation(session, job)
    if r is None or r.status != "started":
        return Requeued(0)
    started = as_utc(started_at) or as_utc(r.started_at) or requeued_at
    seconds, used = _run_charge(r, started, requeued_at)
    # Part of the segment may have been charged while it ran (accrue_usage): charge the rest.
    accrued = r.accrued_gpu_seconds or 0
    charge = used - accrued
    refusal = _requeue_refusal(session, names=names, balances=balances, r=r, held=r.committed_gpu_seconds - accrued,
                               charge=charge, charged_on=requeued_at.date(), now=now)
    # Re-admitted: give back the commitment the accruals took, so it is whole for the next
    # run. Refused: the segment consumes its part of the commitment, as at an end.
    back = accrued if refusal is None else -charge
    _entry(session, at=requeued_at, account_name=r.account_name, kind="usage", job_id=job.id, pool=r.pool,
           gpu_type=r.gpu_type, username=r.username, gpus=0, committed_gpu_seconds=back, gpu_seconds=charge,
           billing_weight=r.billing_weight, actor=actor,
           reason=f"ran {int(seconds)} s on {r.gpus} GPUs, then requeued by the backend"
                  + (f"; not re-admitted: {refusal}" if refusal else ""),
           data={"started_at": started.isoformat(), "ended_at": requeued_at.isoformat(), "requeued": True,
                 "accrued": accrued, **({"over_budget": refusal} if refusal else {})})
    r.status, r.started_at, r.reserved_at = "reserved", None, requeued_at
    r.used_gpu_seconds = (r.used_gpu_seconds or 0) + used
    r.accrued_gpu_seconds, r.accrued_at, r.requeued_at = 0, None, requeued_at
    if refusal is not None:
        r.committed_gpu_seconds -= used
    _apply(balances, names, utcnow(), charged_gpu_seconds=charge, committed_gpu_seconds=back, queued_jobs=1)
    if charge:
        # jobs=0: the job is counted once, in the bucket of the day it ends.
        _add_bucket(session, r.account_name, requeued_at.date(), r.pool, charge, usage=charge)
        _add_decayed_usage(session, r.account_name, charge, requeued_at, float(half_life_s))
    session.flush()
    return Requeued(used, refusal)


def last_requeue_at(session: Session, *, job_id: str) -> datetime | None:
    """When the backend last requeued this job (None if never, or once it finished): no later run starts before it."""
    r = session.get(Reservation, job_id)
    if r is None or r.status == "finished":
        return None
    return as_utc(r.requeued_at)


def charged_gpu_seconds(session: Session, *, job_id: str) -> int:
    """Net GPU-seconds charged to one job so far (every run segment, minus refunds)."""
    return int(session.scalar(select(func.coalesce(func.sum(LedgerEntry.gpu_seconds), 0)).where(
        LedgerEntry.job_id == job_id)) or 0)
