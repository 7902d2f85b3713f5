"""The one writer of the ledger's rows of record: ``ledger_reservation`` (a gang's
reservation, born here) and ``ledger_entry`` (the append-only journal every ledger write adds
to), cut out of ``service.py`` (issue #46) with the batched writer they share.

:func:`write_reservations` is THE writer of reservations: one job's (``service.reserve``, a
batch of one) and a dispatch round's many (``round.py``); :func:`entry` appends one journal
entry for the other writers (start, finish, accrual, release, adjustments, requeues). The
callers hold the chains' locks (``chains.py``) and have judged by the quota rules
(``gateway/domain/quota.py``); nothing here decides whether a gang fits.
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import datetime
from typing import Any

from sqlalchemy import String, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from gateway.kit import bulk
from gateway.kit.errors import Conflict
from gateway.ledger.chains import _chain_deltas_ctes, add_pool_deltas
from gateway.models.ledger import (
    AccountBalance,
    AccountPoolBalance,
    LedgerEntry,
    Reservation,
)

_BALANCE_T = AccountBalance.__table__


def entry(session: Session, **kw: Any) -> LedgerEntry:
    e = LedgerEntry(**kw)
    session.add(e)
    return e


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


def again_or_refuse(status: str | None, r_pool: str | None, job_id: str, pool: str) -> bool:
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
            if again_or_refuse(*have.get(it.job.id, (None, None)), it.job.id, it.pool):
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
        if status is not None and not again_or_refuse(status, r_pool, it.job.id, it.pool):
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
