"""One dispatch round's view of the ledger: read once with the snapshot, written in a few statements.

A round looks at up to hundreds of jobs from a few dozen accounts. Its decision judges
them by the pure quota rules (gateway/domain/quota.py) over ONE view, read here:

* every picked account's chain, its quotas and whether a per-pool limit is set, in ONE
  statement, and the pools' billing terms in one more;
* for the chains WITH a limit (most have none: nothing can refuse them), what their
  accounts hold, their per-pool limits and holdings, and what each budget was charged
  this period.

The decision (``decide``'s :class:`~gateway.domain.quota.Tally`) counts what the round
reserved before each job and returns the reservations it wants. :meth:`RoundLedger.write`
applies them in the round's transaction: the union of their chains locked once, in one
global order (depth from the root, then name, which agrees with every chain's root-first
order); the limited chains judged again over the totals read under those locks (the same
``quota.refusal``); then the reservations, entries, balance deltas and per-pool rows in
ONE statement on Postgres (data-modifying CTEs), one statement each on SQLite, through the
one writer, :func:`gateway.ledger.booking.write_reservations` (a single job's
:func:`reserve` is a batch of one), so ``reading.verify()`` stays empty. If the tree
moved, a limit was set on a chain judged free of limits, or a limited chain's totals
moved so that a reservation no longer fits, the round raises ``ChainChanged`` and the
dispatcher claims the round again (nothing of it was written).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import String, bindparam, case, exists, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased

from gateway.accounts.tree import up_many_cte
from gateway.domain import quota
from gateway.kit.errors import Invalid
from gateway.ledger import booking
from gateway.ledger import chains as ledger_chains
from gateway.ledger import rules as ledger_rules
from gateway.models.accounts import Account, AccountPoolQuota, AccountQuota
from gateway.models.ledger import AccountBalance
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

_LOCKED_ACCOUNT = aliased(Account, name="round_account")
class RoundLedger:
    """The ledger as one dispatch round sees it (one per round and transaction): the view
    its decision judges by (:attr:`view`, read with the snapshot), and the apply step that
    writes what the decision reserved (:meth:`write`)."""

    def __init__(self, session: Session, *, accounts_: Iterable[str], now: datetime):
        self.session = session
        self.now = now
        parent: dict[str, str | None] = {}
        quotas: dict[str, quota.Quota] = {}
        pool_limited: set[str] = set()
        # Held here: the session's identity map holds its objects weakly.
        self._accounts: dict[str, Account] = {}
        leaves = sorted(set(accounts_))
        if leaves:
            # Loads the Account rows too: accounts.chain() and the submit request's
            # session.get(Account) are identity-map hits for the rest of the round.
            for acc, q, limited_here in self.session.execute(_CHAINS, {"leaves": leaves}):
                parent[acc.name] = acc.parent_name
                self._accounts[acc.name] = acc
                if q is not None:
                    quotas[acc.name] = ledger_rules.quota_of(q)
                if limited_here:
                    pool_limited.add(acc.name)
        self.view = quota.ChainView(parent=parent, quotas=quotas, pool_limited=frozenset(pool_limited),
                                    pools=ledger_rules.pool_terms(session) if leaves else quota.PoolTerms())
        # The totals only where a limit is set (most chains have none: nothing to judge).
        limited = {n for leaf in leaves if (names := self.view.chain(leaf)) and self.view.limited(names)
                   for n in names}
        if limited:
            held, limits, used, charged = ledger_rules.read_totals(session, limited, quotas, now=now)
            self.view = dataclasses.replace(self.view, held=held, pool_limits=limits, pool_held=used, charged=charged)

    def write(self, reservations: Sequence[quota.Reservation], *, actor: str) -> None:
        """Write the round's reservations (the decision's, in its order): lock the union of
        their chains once, root first, judge the limited chains again over the totals read
        under the locks (:func:`quota.recheck`), then :func:`booking.write_reservations`.

        Raises ChainChanged (nothing written; the round is claimed again) when the tree
        moved, a limit was set on a chain the round judged free of limits, or a limited
        chain's totals moved so that a reservation no longer fits.
        """
        if not reservations:
            return
        items = []
        known = self.view.pools.known()
        for r in reservations:
            job = r.job
            if job.total_gpus < 0 or job.time_limit_s <= 0:
                raise Invalid("job", "total_gpus must be >= 0 and time_limit_s > 0")
            if r.pool not in known:
                require_known(self.session, r.pool, "pool")  # raises, naming the configured pools
            row, entry = booking.reserve_rows(job=job, pool=r.pool, gpu_type=r.gpu_type, held=r.gpus, weight=r.weight,
                                             committed=r.committed, actor=actor, now=self.now)
            items.append(booking.ReservationWrite(job, r.pool, r.names, row, entry))
        depth = {n: i for r in reservations for i, n in enumerate(r.names)}
        free = {n for r in reservations if not r.limited for n in r.names}
        fresh = self._lock(sorted(depth, key=lambda n: (depth[n], n)), free)  # root-first for every chain
        if fresh is not None:
            names = {n for r in reservations if r.limited for n in r.names}
            quotas = {n: q for n, q in fresh.items() if q is not None}
            held, limits, used, charged = ledger_rules.read_totals(self.session, names, quotas, now=self.now)
            view = quota.ChainView(parent=self.view.parent, quotas=quotas, held=held, pool_limits=limits,
                                   pool_held=used, charged=charged, pools=self.view.pools)
            why = quota.recheck(view, reservations)
            if why is not None:
                raise ledger_chains.ChainChanged(f"a quota's totals moved while the dispatch round was being "
                                                 f"claimed ({why}); retry")
        booking.write_reservations(self.session, items, now=self.now)

    def _lock(self, order: list[str], free: set[str]) -> dict[str, quota.Quota | None] | None:
        """Lock the balance and account rows of ``order`` (in that order), as every ledger writer does.

        Raises ChainChanged when an account moved since the round read the tree, or a limit
        was set on one of ``free`` (accounts of chains the round judged without limits).
        Returns the limits read under the locks of the other accounts (None when there are none).
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
        limits: dict[str, quota.Quota | None] = {}
        for n in order:
            r = got.get(n)
            if r is None or r.fresh_parent != self.view.parent.get(n):
                raise ledger_chains.ChainChanged(f"the account tree above {n!r} changed while the dispatch round "
                                                 "was being claimed; retry")
            set_here = r.pool_limited or any(getattr(r, c) is not None for c in _LIMITS)
            if n in free:
                if set_here:
                    raise ledger_chains.ChainChanged(f"a limit was set on {n!r} while the dispatch round was being "
                                                     "claimed; retry")
            else:
                limits[n] = ledger_rules.quota_of(r) if r.has_quota else None
        return limits or None


def _lock_stmt(where, order_by):
    """The balance and account rows of a round's chains, locked in ``order_by``, with what
    the round must find unchanged (the parent, no limit set)."""
    return (select(AccountBalance.account_name, _LOCKED_ACCOUNT.parent_name.label("fresh_parent"),
                   AccountQuota.account_name.label("has_quota"),
                   *[getattr(AccountQuota, c) for c in (*_LIMITS, "budget_period", "budget_window_days")],
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
