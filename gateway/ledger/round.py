"""One dispatch round's view of the ledger: read once per round, written in a few statements.

A round looks at up to hundreds of jobs from a few dozen accounts. Asked job by job, the
ledger's rules cost about seven statements per job (budget chain, account chain, limits,
the chain lock, three writes). Most accounts have no limit anywhere in their chain, and
for those the rules cannot refuse anything: :func:`gateway.ledger.service.reserve` would
lock the chain only to add the same deltas. So a round:

* reads every picked account's chain, its quotas and whether a per-pool limit is set, in
  ONE statement (and the pools' billing weights once, when the first job is reserved);
* asks the exact per-job rules (``admission_check``, ``reserve``) only for accounts WITH a
  limit in their chain: their refusals and wording are the ledger's own;
* for the others, collects the reservations and writes them at the end of the round, in
  the round's transaction: the union of their chains locked once, in one global order
  (depth from the root, then name, which agrees with every chain's root-first order), the
  reservations, entries, balance deltas and per-pool rows: in ONE statement on Postgres
  (data-modifying CTEs), one statement each on SQLite.

The rows written are the ones :func:`reserve` writes (``reserve_rows``), so
``ledger.verify()`` stays empty. If the tree moved, or a limit was set on one of these
chains between the read and the lock, the round raises ``ChainChanged`` and the
dispatcher claims the round again (nothing of it was written).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import String, bindparam, case, exists, func, null, select, union_all
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased

from gateway.accounts import service as accounts
from gateway.accounts.models import Account, AccountPoolQuota, AccountQuota
from gateway.jobs.schemas import normalise_gpu_type
from gateway.kit import bulk
from gateway.kit.errors import Conflict, Invalid
from gateway.ledger import service as ledger
from gateway.ledger.models import (
    AccountBalance,
    AccountPoolBalance,
    GpuBillingWeight,
    LedgerEntry,
    Reservation,
)
from gateway.pools.models import Pool

_LIMITS = ("max_gpus", "budget_gpu_seconds", "max_queued_jobs", "max_queued_jobs_per_user")
_POOL_LIMITED = exists().where(AccountPoolQuota.account_name == Account.name, AccountPoolQuota.max_gpus.isnot(None))

# Every picked account and its ancestors (UNION, so a cycle ends the walk), with their
# quota row and whether a per-pool limit is set on them: one statement per round.
_UP = (select(Account.name, Account.parent_name).where(Account.name.in_(bindparam("leaves", expanding=True)))
       .cte("round_chain", recursive=True))
_PARENT = aliased(Account)
_UP = _UP.union(select(_PARENT.name, _PARENT.parent_name).where(_PARENT.name == _UP.c.parent_name))
_CHAINS = (select(Account, AccountQuota, _POOL_LIMITED.label("pool_limited"))
           .outerjoin(AccountQuota, AccountQuota.account_name == Account.name)
           .where(Account.name.in_(select(_UP.c.name))))

# The pools (cost, whether routable) and the billing weights in one statement: a weight's
# row has its GPU type ("*" for the pool's default), a pool's has none.
_POOLS_AND_WEIGHTS = union_all(
    select(Pool.name, Pool.cost, Pool.configured, Pool.state, null().label("gpu_type"), null().label("weight")),
    select(GpuBillingWeight.pool, null(), null(), null(), GpuBillingWeight.gpu_type, GpuBillingWeight.weight))

_LOCKED_ACCOUNT = aliased(Account, name="round_account")
_BALANCE_T = AccountBalance.__table__
_DELTA_COLS = ("reserved_gpus", "committed_gpu_seconds", "queued_jobs")
_ADD_DELTAS = (
    _BALANCE_T.update().where(_BALANCE_T.c.account_name == bindparam("b_name"))
    .values(**{c: _BALANCE_T.c[c] + bindparam(f"d_{c}") for c in _DELTA_COLS}, updated_at=bindparam("b_now"))
)


@functools.lru_cache(maxsize=8)
def _flush_sql(dialect, res_cols: tuple[str, ...], entry_cols: tuple[str, ...]) -> Any:
    """Postgres: a round's deferred reservations in one statement.

    ``:rows`` holds one record per job: its reservation row (``res_cols``, as
    :func:`ledger.reserve_rows` makes it), its entry (``e_`` + ``entry_cols``), its chain
    (root first) and its place in the round. The reservation is inserted, or written again
    over a released one (``ON CONFLICT ... WHERE.status = 'released'``); a job that holds
    one already is left out of everything (RETURNING tells the caller which were written).
    For the written ones: the entries in the round's order, the deltas added to every chain
    account's balance, and the GPUs held per chain account and pool upserted. The chains'
    balance rows are locked by the caller first, root-first (``RoundLedger._lock``).
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


@dataclasses.dataclass(frozen=True)
class _Deferred:
    job: Any
    pool: str
    names: tuple[str, ...]
    row: dict[str, Any]
    entry: dict[str, Any]


class RoundLedger:
    """The ledger as one dispatch round sees it (one per round and transaction)."""

    def __init__(self, session: Session, *, accounts_: Iterable[str], now: datetime):
        self.session = session
        self.now = now
        self._parent: dict[str, str | None] = {}
        # Held here: the session's identity map holds its objects weakly.
        self._accounts: dict[str, Account] = {}
        self._quota: dict[str, AccountQuota] = {}
        self._pool_limited: set[str] = set()
        leaves = sorted(set(accounts_))
        if leaves:
            # Loads the Account rows too: accounts.chain() and the submit request's
            # session.get(Account) are identity-map hits for the rest of the round.
            for acc, quota, pool_limited in self.session.execute(_CHAINS, {"leaves": leaves}):
                self._parent[acc.name] = acc.parent_name
                self._accounts[acc.name] = acc
                if quota is not None:
                    self._quota[acc.name] = quota
                if pool_limited:
                    self._pool_limited.add(acc.name)
        self._chains: dict[str, tuple[str, ...] | None] = {}
        self._pools: dict[str, tuple[float | None, bool]] | None = None  # name -> (cost, routable)
        self._weights: dict[tuple[str, str], float] = {}
        self._deferred: list[_Deferred] = []

    # ------------------------------------------------------------- reading

    def chain(self, account: str) -> tuple[str, ...] | None:
        """The account's chain, root first, or None when it cannot be walked here (unknown, cycle)."""
        if account not in self._chains:
            out: list[str] = []
            cur: str | None = account
            while cur is not None and cur in self._parent and len(out) <= accounts.MAX_DEPTH and cur not in out:
                out.append(cur)
                cur = self._parent[cur]
            self._chains[account] = tuple(reversed(out)) if cur is None else None
        return self._chains[account]

    def limited(self, account: str) -> bool:
        """Whether a limit (quota, budget, queue cap, per-pool limit) is set in the chain: the
        per-job rules apply. True too when the chain could not be read here (they say why)."""
        names = self.chain(account)
        if names is None:
            return True
        for n in names:
            q = self._quota.get(n)
            if n in self._pool_limited or (q is not None and any(getattr(q, c) is not None for c in _LIMITS)):
                return True
        return False

    def budget_verdict(self, *, job: Any, now: datetime) -> tuple[str, str] | None:
        """:func:`ledger.budget_verdict` of the job, from the chain read once per round."""
        names = self.chain(job.account_name)
        if names is None:
            return ledger.budget_verdict(self.session, account=job.account_name, total_gpus=job.total_gpus,
                                         time_limit_s=job.time_limit_s, gpu_type=(job.spec or {}).get("gpu_type"),
                                         now=now)
        if not any((q := self._quota.get(n)) is not None and q.budget_gpu_seconds is not None for n in names):
            return None  # what budget_verdict_of says of a chain without a budget, without building its rows
        rows = [_BudgetRow(n, *((q.budget_gpu_seconds, q.budget_period, q.budget_window_days)
                                if (q := self._quota.get(n)) is not None else (None, None, None))) for n in names]
        return ledger.budget_verdict_of(self.session, rows, total_gpus=job.total_gpus,
                                        time_limit_s=job.time_limit_s, gpu_type=(job.spec or {}).get("gpu_type"),
                                        now=now)

    def _load_pools(self) -> dict[str, tuple[float | None, bool]]:
        if self._pools is None:
            self._pools, self._weights = {}, {}
            for name, cost, configured, state, gpu_type, weight in self.session.execute(_POOLS_AND_WEIGHTS):
                if gpu_type is None:
                    self._pools[name] = (cost, bool(configured) and state == "active")
                else:
                    self._weights[(name, gpu_type)] = float(weight)
        return self._pools

    def known_pool(self, pool: str) -> bool:
        return pool in self._load_pools()

    def known_pools(self) -> frozenset[str]:
        """The pools the ledger knows (a reservation in any other is refused, naming them)."""
        return frozenset(self._load_pools())

    def weight(self, pool: str, gpu_type: str | None) -> float:
        """The billing weight :func:`ledger.reserve` applies: the type's, the pool's "*", its cost, else 1."""
        pools = self._load_pools()
        for key in ((pool, gpu_type or "*"), (pool, "*")):
            if key in self._weights:
                return self._weights[key]
        cost = pools.get(pool, (None, False))[0]
        return float(cost) if cost is not None else 1.0

    # ------------------------------------------------------------- writing

    def defer_reserve(self, *, job: Any, pool: str, actor: str, now: datetime, gpus: int | None = None) -> None:
        """:func:`ledger.reserve` for a job whose chain has no limit, written by :meth:`flush`.

        Such a reservation cannot be refused; the checks that do not depend on the chain
        (the job's size, the pool) run now, as reserve() runs them.
        """
        names = self.chain(job.account_name)
        if names is None or self.limited(job.account_name):
            raise ValueError(f"{job.account_name}: a chain with limits is reserved job by job (ledger.reserve)")
        if job.total_gpus < 0 or job.time_limit_s <= 0:
            raise Invalid("job", "total_gpus must be >= 0 and time_limit_s > 0")
        if not self.known_pool(pool):
            ledger.check_pool(self.session, pool)  # raises, naming the known pools
        held = job.total_gpus if gpus is None else max(int(gpus), job.total_gpus)
        gpu_type = normalise_gpu_type((job.spec or {}).get("gpu_type"))
        weight = self.weight(pool, gpu_type)
        committed = ledger.committed_for(held, job.time_limit_s, weight)
        row, entry = ledger.reserve_rows(job=job, pool=pool, gpu_type=gpu_type, held=held, weight=weight,
                                         committed=committed, actor=actor, now=ledger._now(now))
        self._deferred.append(_Deferred(job, pool, names, row, entry))

    def flush(self) -> None:
        """Write the deferred reservations: lock the chains once, then one statement per table."""
        items, self._deferred = self._deferred, []
        if not items:
            return
        session = self.session
        conn = session.connection()
        depth = {n: i for it in items for i, n in enumerate(it.names)}
        order = sorted(depth, key=lambda n: (depth[n], n))  # root-first for every chain
        self._lock(order)
        if conn.dialect.name == "postgresql":
            self._write_pg(conn, items)
        else:
            self._write(conn, items)
        touched = set(depth)
        ids = {it.job.id for it in items}
        for obj in list(session.identity_map.values()):  # Core writes: drop stale copies
            if isinstance(obj, (AccountBalance, AccountPoolBalance)) and obj.account_name in touched or (
                    isinstance(obj, Reservation) and obj.job_id in ids):
                session.expire(obj)

    @staticmethod
    def _again_or_refuse(status: str | None, r_pool: str | None, it: _Deferred) -> bool:
        """What :func:`ledger.reserve` does with a job that has a reservation row: False to
        skip it (reserved or started in the same pool: idempotent), True to reserve again
        (released earlier, e.g. a submission the backend refused); a Conflict otherwise."""
        if status in ("reserved", "started"):
            if r_pool != it.pool:
                raise Conflict(f"job {it.job.id} already holds a reservation in pool {r_pool}")
            return False
        if status == "finished":
            raise Conflict(f"job {it.job.id} already finished; it cannot reserve again")
        return True

    def _write_pg(self, conn, items: list[_Deferred]) -> None:
        """Postgres: the reservations, their entries, the chains' balance deltas and per-pool
        rows in ONE statement (``_flush_sql``); only the jobs whose reservation row was
        written (new, or released before) count. A job left out already had a reservation:
        skipped when it is the same one (reserve() is idempotent), else a Conflict."""
        doc = [{**it.row, **{f"e_{k}": v for k, v in it.entry.items()}, "chain": list(it.names), "ord": i}
               for i, it in enumerate(items)]
        sql = _flush_sql(conn.dialect, tuple(items[0].row), tuple(items[0].entry))
        written = set(conn.execute(sql, {"rows": bulk.document(doc), "b_now": self.now}).scalars())
        left = [it for it in items if it.job.id not in written]
        if left:
            have = {j: (st, p) for j, st, p in conn.execute(_HAVE_PG, {"ids": [it.job.id for it in left]})}
            for it in left:
                if self._again_or_refuse(*have.get(it.job.id, (None, None)), it):
                    raise Conflict(f"job {it.job.id}: its reservation changed during the dispatch round; retry")

    def _write(self, conn, items: list[_Deferred]) -> None:
        """SQLite: the reservations a round's jobs already have read first, then one statement per table."""
        ids = [it.job.id for it in items]
        have = {j: (st, p) for j, st, p in conn.execute(
            select(Reservation.job_id, Reservation.status, Reservation.pool).where(Reservation.job_id.in_(ids)))}
        new_rows, again, entries = [], [], []
        deltas: dict[str, list[int]] = {}
        pool_deltas: dict[tuple[str, str], int] = {}
        for it in items:
            status, r_pool = have.get(it.job.id, (None, None))
            if status is not None and not self._again_or_refuse(status, r_pool, it):
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
            conn.execute(_ADD_DELTAS, [{"b_name": n, "b_now": self.now, **{f"d_{c}": v for c, v in zip(_DELTA_COLS, d)}}
                                       for n, d in deltas.items()])
        if pool_deltas:
            ledger.add_pool_deltas(self.session, pool_deltas)

    def _lock(self, order: list[str]) -> None:
        """Lock the balance and account rows of ``order`` (in that order), as every ledger writer does.

        Raises ChainChanged when an account moved since the round read the tree, or a limit
        was set on one of them: the round is claimed again and sees it.
        """
        if self.session.get_bind().dialect.name == "postgresql":
            stmt, params = _LOCK_PG, {"order": order}  # one statement text whatever the accounts
        else:
            rank = case({n: i for i, n in enumerate(order)}, value=AccountBalance.account_name)
            stmt, params = _lock_stmt(AccountBalance.account_name.in_(order), rank), {}
        rows = self.session.execute(stmt, params).all()
        if len(rows) < len(order):
            # Accounts made before the ledger (or by the bootstrap CLI) have no balance row yet.
            ledger._insert_missing_balances(self.session, sorted(set(order) - {r.account_name for r in rows}))
            rows = self.session.execute(stmt, params).all()
        got = {r.account_name: r for r in rows}
        for n in order:
            r = got.get(n)
            if r is None or r.fresh_parent != self._parent.get(n):
                raise ledger.ChainChanged(f"the account tree above {n!r} changed while the dispatch round was "
                                          "being claimed; retry")
            if r.pool_limited or any(getattr(r, c) is not None for c in _LIMITS):
                raise ledger.ChainChanged(f"a limit was set on {n!r} while the dispatch round was being claimed; "
                                          "retry")


def _lock_stmt(where, order_by):
    """The balance and account rows of a round's chains, locked in ``order_by``, with what
    the round must find unchanged (the parent, no limit set)."""
    return (select(AccountBalance.account_name, _LOCKED_ACCOUNT.parent_name.label("fresh_parent"),
                   *[getattr(AccountQuota, c) for c in _LIMITS],
                   exists().where(AccountPoolQuota.account_name == AccountBalance.account_name,
                                  AccountPoolQuota.max_gpus.isnot(None)).label("pool_limited"))
            .join(_LOCKED_ACCOUNT, _LOCKED_ACCOUNT.name == AccountBalance.account_name)
            .outerjoin(AccountQuota, AccountQuota.account_name == AccountBalance.account_name)
            .where(where).order_by(order_by)
            .with_for_update(of=[AccountBalance, _LOCKED_ACCOUNT], key_share=True))


_ORDER = bindparam("order", type_=ARRAY(String))
# Postgres: the order as one array parameter (``= ANY``, ``array_position``), not an IN list
# and a CASE with a branch per account, which made a new statement for every round's set.
_LOCK_PG = _lock_stmt(AccountBalance.account_name == func.any(_ORDER),
                      func.array_position(_ORDER, AccountBalance.account_name))


@dataclasses.dataclass(frozen=True)
class _BudgetRow:
    name: str
    budget_gpu_seconds: int | None
    budget_period: str | None
    budget_window_days: int | None
