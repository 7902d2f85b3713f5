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

The rest of the ledger: ``chains.py`` (the balance rows: created, locked root first, their
totals moved), ``rules.py`` (admission and budget rules, and the reads they need),
``reading.py`` (fair share, balances, ``verify``, usage), ``requeues.py`` (a run the backend
requeued), ``round.py`` (a dispatch round's batched reads and writes).
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import date, datetime
from typing import Any

from sqlalchemy import String, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.domain import quota
from gateway.domain.fairshare import decay
from gateway.domain.shapes import normalise_gpu_type
from gateway.kit import bulk
from gateway.kit.errors import Conflict, Invalid, QuotaExceeded
from gateway.kit.timeutil import as_utc, utcnow
from gateway.ledger.chains import (
    _CHAIN_ACCOUNT,
    _LOCKED_CHAIN_FROM,
    _UP,
    _apply,
    _apply_pool,
    _balance_rows,
    _chain_deltas_ctes,
    _lock_chain,
    _locked_chain_rows,
    _locked_reservation,
    add_pool_deltas,
)
from gateway.ledger.rules import (
    _now,
    _run_charge,
    charged_of,
    committed_for,
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
{_chain_deltas_ctes("up")}
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
