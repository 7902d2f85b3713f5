"""The ledger's balance rows of an account chain: created on demand (``open_account``,
missing rows race-free), locked root first (``_lock_chain``: the one lock order of every
ledger writer), their running totals moved (``_apply``, ``add_pool_deltas``), and dropped
with a deleted account (``close_account``). The one writer of ``account_balance`` and
``account_pool_balance`` rows (tests/layout/test_table_writers.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session, aliased, object_session
from sqlalchemy.orm.attributes import set_committed_value

from gateway.accounts.tree import MAX_DEPTH, up_cte
from gateway.kit import bulk
from gateway.kit.errors import Conflict, NotFound
from gateway.kit.timeutil import utcnow
from gateway.models.accounts import Account
from gateway.models.ledger import (
    AccountBalance,
    AccountPoolBalance,
    Reservation,
)


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


def _locked_reservation(session: Session, job: Any) -> tuple[list[str], dict[str, AccountBalance], Reservation | None]:
    r0 = session.get(Reservation, job.id)
    account = r0.account_name if r0 is not None else job.account_name
    names, balances = _lock_chain(session, account)
    r = session.scalars(select(Reservation).where(Reservation.job_id == job.id)
                        .execution_options(populate_existing=True)).first()
    return names, balances, r


def _chain_deltas_ctes(source: str) -> str:
    """Postgres: ``balances`` and ``per_pool``, the running totals moved by the rows of
    ``source`` (``account_name, pool, gpus, committed_gpu_seconds``: one row per reserved job
    and chain account; ``:b_now`` the time), for a one-statement writer (``booking._flush_sql``)."""
    return f"""balances AS (
    UPDATE account_balance SET reserved_gpus = account_balance.reserved_gpus + d.g,
        committed_gpu_seconds = account_balance.committed_gpu_seconds + d.c,
        queued_jobs = account_balance.queued_jobs + d.q, updated_at = :b_now
    FROM (SELECT account_name, sum(gpus) AS g, sum(committed_gpu_seconds) AS c, count(*) AS q
          FROM {source} GROUP BY account_name) AS d
    WHERE account_balance.account_name = d.account_name),
per_pool AS (
    INSERT INTO account_pool_balance (account_name, pool, reserved_gpus)
    SELECT account_name, pool, sum(gpus) FROM {source} WHERE gpus <> 0 GROUP BY account_name, pool
    ON CONFLICT (account_name, pool)
    DO UPDATE SET reserved_gpus = account_pool_balance.reserved_gpus + EXCLUDED.reserved_gpus)"""
