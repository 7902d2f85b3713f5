"""The quota ledger's writers: reserve, start, finish, accrue, release, admin adjustments,
re-parenting (issue #46 cut the ledger along its seams; the other modules are named below).

Every write follows the same steps, inside the caller's transaction (we only flush):

1. lock the account chain's ``account_balance`` rows, root first (``chains.py``: ``SELECT ...
   FOR UPDATE`` on Postgres; SQLite writers are already serialised by ``BEGIN IMMEDIATE``);
2. read the job's reservation and decide (idempotent: a repeated call is a no-op), by the
   rules of ``rules.py``;
3. append ledger entries and update the running totals of every account in the chain.

Because every writer for an account holds the lock on each ancestor's balance row, two
dispatchers can never both see room for the last gang (docs/ledger.md, "Concurrency").

The rest of the ledger: ``booking.py`` (the one writer of reservation and journal rows),
``chains.py`` (the balance rows: created, locked root first, their
totals moved), ``rules.py`` (admission and budget rules, and the reads they need),
``reading.py`` (fair share, balances, ``verify``, usage), ``requeues.py`` (a run the backend
requeued), ``round.py`` (a dispatch round's batched reads and writes).
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.domain import quota
from gateway.domain.fairshare import decay
from gateway.domain.quota import committed_for
from gateway.domain.shapes import normalise_gpu_type
from gateway.kit.errors import Conflict, Invalid, QuotaExceeded
from gateway.kit.timeutil import as_utc, utcnow
from gateway.ledger import booking
from gateway.ledger.chains import (
    _CHAIN_ACCOUNT,
    _LOCKED_CHAIN_FROM,
    _UP,
    _apply,
    _apply_pool,
    _balance_rows,
    _lock_chain,
    _locked_chain_rows,
    _locked_reservation,
)
from gateway.ledger.rules import (
    _now,
    _run_charge,
    charged_of,
    pool_balances,
)
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
    if not booking.again_or_refuse(r_status, r_pool, job.id, pool):
        return
    quotas = {r.name: quota.Quota(**{c: getattr(r, c) for c in _QUOTA_COLS}) for r in rows if r.has_quota}
    committed = committed_for(held, job.time_limit_s, weight)
    view = quota.ChainView(
        parent={}, quotas=quotas,
        held={r.name: quota.Held(r.reserved_gpus, r.committed_gpu_seconds) for r in rows},
        pool_limits={(r.name, pool): r.pool_limit for r in rows if r.pool_limit is not None},
        pool_held={(r.name, pool): r.pool_held or 0 for r in rows if r.pool_limit is not None},
        charged=charged_of(session, quotas, now))
    why = quota.refusal(view, names, gpus=held, pools=[pool], committed=committed)
    if why:
        raise QuotaExceeded(why)
    row, entry = booking.reserve_rows(job=job, pool=pool, gpu_type=gpu_type, held=held, weight=weight,
                              committed=committed, actor=actor, now=now)
    booking.write_reservations(session, [booking.ReservationWrite(job, pool, tuple(names), row, entry)], now=now)


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
    booking.entry(session, at=started_at, account_name=r.account_name, kind="start", job_id=job.id, pool=r.pool,
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
        booking.entry(session, at=ended_at, account_name=r.account_name, kind="usage", job_id=job.id, pool=r.pool,
               gpu_type=r.gpu_type, username=r.username, gpus=0, committed_gpu_seconds=-charge, gpu_seconds=charge,
               billing_weight=r.billing_weight, actor=actor,
               reason=f"{ran} ({accrued} GPU-s of it charged while running)" if accrued else ran,
               data={"started_at": started.isoformat(), "ended_at": ended_at.isoformat(), "accrued": accrued})
    rest = r.committed_gpu_seconds - used
    booking.entry(session, at=ended_at, account_name=r.account_name, kind="release", job_id=job.id, pool=r.pool,
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
    booking.entry(session, at=now, account_name=r.account_name, kind="usage", job_id=job.id, pool=r.pool,
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
    booking.entry(session, at=now, account_name=r.account_name, kind="release", job_id=job.id, pool=r.pool,
           gpu_type=r.gpu_type, username=r.username, gpus=-r.gpus, committed_gpu_seconds=-r.committed_gpu_seconds,
           gpu_seconds=0, billing_weight=r.billing_weight, actor=actor, reason=reason or "released")
    _apply(balances, names, now, reserved_gpus=-r.gpus, committed_gpu_seconds=-r.committed_gpu_seconds,
           queued_jobs=-1)
    _apply_pool(session, names, r.pool, -r.gpus)
    session.flush()


def adjust(session: Session, *, account: str, kind: str, gpu_seconds: int, by: Who, reason: str,
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
    e = booking.entry(session, at=now, account_name=account, kind=kind, job_id=job_id, pool=pool, gpus=0,
               committed_gpu_seconds=0, gpu_seconds=signed, billing_weight=1.0, actor=by.subject,
               reason=reason.strip())
    _apply(balances, names, now, charged_gpu_seconds=signed)
    _add_bucket(session, account, now.date(), pool or "", signed, adjustment=signed)
    session.flush()
    audit.record(session, by=by, action="ledger.adjust", target_kind="ledger_entry", target_name=str(e.id),
                 account=account, before=None, after={"kind": kind, "gpu_seconds": signed, "job_id": job_id,
                                                      "pool": pool, "reason": reason.strip()})
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
