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

Both go through one writer, :func:`gateway.ledger.service.write_reservations` (a single
job's :func:`reserve` is a batch of one), so ``reading.verify()`` stays empty. If the tree
moved, or a limit was set on one of these chains between the read and the lock, the round
raises ``ChainChanged`` and the dispatcher claims the round again (nothing of it was written).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import String, bindparam, case, exists, func, null, select, union_all
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased

from gateway.accounts.tree import up_many_cte, walk_up
from gateway.domain.shapes import normalise_gpu_type
from gateway.kit.errors import Invalid
from gateway.ledger import chains as ledger_chains
from gateway.ledger import rules as ledger_rules
from gateway.ledger import service as ledger
from gateway.models.accounts import Account, AccountPoolQuota, AccountQuota
from gateway.models.ledger import (
    AccountBalance,
    GpuBillingWeight,
)
from gateway.models.pools import Pool
from gateway.models.specs import field_of
from gateway.pools.service import require_known

# The limits the ledger judges when it reserves (max_queued_jobs and its per-user twin are
# judged at submit only: gateway/jobs/caps.py, docs/ledger.md).
_LIMITS = ("max_gpus", "budget_gpu_seconds")
_POOL_LIMITED = exists().where(AccountPoolQuota.account_name == Account.name, AccountPoolQuota.max_gpus.isnot(None))

# Every picked account and its ancestors (UNION, so a cycle ends the walk), with their
# quota row and whether a per-pool limit is set on them: one statement per round.
_UP = up_many_cte("round_chain", bindparam("leaves", expanding=True))
_CHAINS = (select(Account, AccountQuota, _POOL_LIMITED.label("pool_limited"))
           .outerjoin(AccountQuota, AccountQuota.account_name == Account.name)
           .where(Account.name.in_(select(_UP.c.name))))

# The pools (cost, whether routable) and the billing weights in one statement: a weight's
# row has its GPU type ("*" for the pool's default), a pool's has none.
_POOLS_AND_WEIGHTS = union_all(
    select(Pool.name, Pool.cost, Pool.configured, Pool.state, null().label("gpu_type"), null().label("weight")),
    select(GpuBillingWeight.pool, null(), null(), null(), GpuBillingWeight.gpu_type, GpuBillingWeight.weight))

_LOCKED_ACCOUNT = aliased(Account, name="round_account")
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
        self._deferred: list[ledger.ReservationWrite] = []

    # ------------------------------------------------------------- reading

    def chain(self, account: str) -> tuple[str, ...] | None:
        """The account's chain, root first, or None when it cannot be walked here (unknown, cycle)."""
        if account not in self._chains:
            self._chains[account] = walk_up(self._parent, account)
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
        """:func:`ledger_rules.budget_verdict` of the job, from the chain read once per round."""
        names = self.chain(job.account_name)
        if names is None:
            return ledger_rules.budget_verdict(self.session, account=job.account_name, total_gpus=job.total_gpus,
                                         time_limit_s=job.time_limit_s, gpu_type=field_of(job, "gpu_type", self.session),
                                         now=now)
        if not any((q := self._quota.get(n)) is not None and q.budget_gpu_seconds is not None for n in names):
            return None  # what budget_verdict_of says of a chain without a budget, without building its rows
        rows = [_BudgetRow(n, *((q.budget_gpu_seconds, q.budget_period, q.budget_window_days)
                                if (q := self._quota.get(n)) is not None else (None, None, None))) for n in names]
        return ledger_rules.budget_verdict_of(self.session, rows, total_gpus=job.total_gpus,
                                        time_limit_s=job.time_limit_s, gpu_type=field_of(job, "gpu_type", self.session),
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
            require_known(self.session, pool, "pool")  # raises, naming the configured pools
        held = job.total_gpus if gpus is None else max(int(gpus), job.total_gpus)
        gpu_type = normalise_gpu_type(field_of(job, "gpu_type", self.session))
        weight = self.weight(pool, gpu_type)
        committed = ledger_rules.committed_for(held, job.time_limit_s, weight)
        row, entry = ledger.reserve_rows(job=job, pool=pool, gpu_type=gpu_type, held=held, weight=weight,
                                         committed=committed, actor=actor, now=ledger_rules._now(now))
        self._deferred.append(ledger.ReservationWrite(job, pool, names, row, entry))

    def reserve(self, *, job: Any, pool: str, actor: str, now: datetime, gpus: int | None = None) -> None:
        """Reserve the job's gang in ``pool`` for the round: a chain with a limit by the per-job
        rule at once (:func:`ledger.reserve`: it may refuse, QuotaExceeded, writing nothing),
        any other with the round's others at :meth:`flush`. Both write through
        :func:`ledger.write_reservations`."""
        if self.limited(job.account_name):
            ledger.reserve(self.session, job=job, pool=pool, actor=actor, now=now, gpus=gpus)
        else:
            self.defer_reserve(job=job, pool=pool, actor=actor, now=now, gpus=gpus)

    def flush(self) -> None:
        """Write the deferred reservations: lock the chains once, then :func:`ledger.write_reservations`."""
        items, self._deferred = self._deferred, []
        if not items:
            return
        depth = {n: i for it in items for i, n in enumerate(it.names)}
        self._lock(sorted(depth, key=lambda n: (depth[n], n)))  # root-first for every chain
        ledger.write_reservations(self.session, items, now=self.now)

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
            ledger_chains._insert_missing_balances(self.session, sorted(set(order) - {r.account_name for r in rows}))
            rows = self.session.execute(stmt, params).all()
        got = {r.account_name: r for r in rows}
        for n in order:
            r = got.get(n)
            if r is None or r.fresh_parent != self._parent.get(n):
                raise ledger_chains.ChainChanged(f"the account tree above {n!r} changed while the dispatch round "
                                                 "was being claimed; retry")
            if r.pool_limited or any(getattr(r, c) is not None for c in _LIMITS):
                raise ledger_chains.ChainChanged(f"a limit was set on {n!r} while the dispatch round was being "
                                                 "claimed; retry")


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
