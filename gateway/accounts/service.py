"""Account tree logic: chains, subtrees, effective (inherited) quotas, quotas and members.

Creating, re-parenting and deleting an account move ledger rows too: they are in
gateway/admin/lifecycle.py, so that this module imports nothing from the ledger.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from gateway.accounts.tree import MAX_DEPTH, up_cte
from gateway.accounts.tree import descendants as _descendants
from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.domain.tree import walk_up
from gateway.kit.db import compiled_read
from gateway.kit.errors import Conflict, Invalid, NotFound
from gateway.kit.names import ACCOUNT_NAME, ACCOUNT_NAME_RE
from gateway.kit.timeutil import utcnow
from gateway.models.accounts import (
    Account,
    AccountMember,
    AccountPoolQuota,
    AccountQuota,
)

QUOTA_FIELDS = ("max_gpus", "guaranteed_gpus", "budget_gpu_seconds", "max_queued_jobs", "max_queued_jobs_per_user")
# Limits that are absurd rather than merely large: refuse them so a typo cannot disable a quota.
QUOTA_MAX = {"max_gpus": 1_000_000, "guaranteed_gpus": 1_000_000, "budget_gpu_seconds": 10**15,
             "max_queued_jobs": 10_000_000, "max_queued_jobs_per_user": 10_000_000}
# The per-pool settings: (the body's field, the account_pool_quota column).
PER_POOL = (("max_gpus_per_pool", "max_gpus"), ("guaranteed_gpus_per_pool", "guaranteed_gpus"))
MAX_POOL_GPUS = 1_000_000


def get_or_raise(session: Session, *, name: str, field: str = "path.name") -> Account:
    acc = session.get(Account, name)
    if acc is None:
        raise NotFound(f"no account {name!r}") if field.startswith("path") else Invalid(field, f"unknown account {name!r}")
    return acc


_CHAIN_UP = up_cte("chain")
_CHAIN = select(Account).join(_CHAIN_UP, Account.name == _CHAIN_UP.c.name).order_by(_CHAIN_UP.c.depth.desc())


def chain(session: Session, name: str) -> list[Account]:
    """The account and its ancestors, root first (one statement: accounts/tree.py)."""
    out = list(session.scalars(_CHAIN, {"leaf": name}))
    _check_chain(name, len(out), out[0].parent_name if out else None)
    return out


def _check_chain(name: str, length: int, root_parent: str | None) -> None:
    """The checks of a chain read root first: it exists, is no deeper than the tree may be
    (else a cycle), and reaches a root (its first account has no parent)."""
    if not length:
        raise NotFound(f"no account {name!r}")
    if length > MAX_DEPTH:
        raise Conflict(f"account tree above {name!r} is deeper than {MAX_DEPTH} levels or has a cycle")
    if root_parent is not None:
        raise NotFound(f"no account {root_parent!r}")


def load_tree(session: Session) -> dict[str, Account]:
    return {a.name: a for a in session.scalars(select(Account))}


def children_map(tree: dict[str, Account]) -> dict[str | None, list[str]]:
    kids: dict[str | None, list[str]] = {}
    for a in tree.values():
        kids.setdefault(a.parent_name if a.parent_name in tree else None, []).append(a.name)
    for v in kids.values():
        v.sort()
    return kids


def descendants(tree: dict[str, Account], name: str) -> list[str]:
    return _descendants(children_map(tree), name)


@dataclasses.dataclass
class EffectiveLimit:
    value: int | None
    source: str | None  # account the value is set on (None: unlimited)


def effective_quota(session: Session, name: str) -> dict[str, Any]:
    """Each limit as it applies to ``name``: its own value, else the nearest ancestor's.

    Two statements built once (kit/db.py ``compiled_read``), rows as plain tuples: the chain
    with each account's quota row, and the chain's per-pool quota rows (were three statements
    of ORM objects; the accounts page asks this per account, issue #46). The chain's checks
    are :func:`chain`'s."""
    chain_rows = compiled_read(session, "accounts.chain_quotas", _chain_quotas).rows(session, {"leaf": name})
    _check_chain(name, len(chain_rows), chain_rows[0].parent if chain_rows else None)
    accounts = [r.name for r in chain_rows]
    rows = {r.name: r for r in chain_rows if r.has_quota}
    pool_rows = compiled_read(session, "accounts.chain_pool_quotas", _chain_pool_quotas).rows(session, {"leaf": name})
    return _effective(accounts, rows, pool_rows)


def _all_quotas():
    q = AccountQuota
    return select(q.account_name, *(getattr(q, f) for f in QUOTA_FIELDS), q.budget_period, q.budget_window_days)


def _all_pool_quotas():
    pq = AccountPoolQuota
    return select(pq.account_name, pq.pool, *(getattr(pq, column) for _field, column in PER_POOL))


def _chain_quotas():
    """The chain of ``:leaf`` root first, each account with its quota row's columns (NULL
    without one; ``has_quota`` says which)."""
    up = up_cte("chain_q")
    q = AccountQuota
    return (select(up.c.name, up.c.parent, (q.account_name.is_not(None)).label("has_quota"),
                   *(getattr(q, f) for f in QUOTA_FIELDS), q.budget_period, q.budget_window_days)
            .outerjoin(q, q.account_name == up.c.name).order_by(up.c.depth.desc()))


def _chain_pool_quotas():
    up = up_cte("chain_pq")
    pq = AccountPoolQuota
    return (select(pq.account_name, pq.pool, *(getattr(pq, column) for _field, column in PER_POOL))
            .join(up, up.c.name == pq.account_name).order_by(pq.account_name, pq.pool))


def effective_quotas(session: Session, tree: dict[str, Account] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`effective_quota` of every account of ``tree`` (``load_tree``; default: every
    account, read as plain rows), from two statements in all instead of three per account (the
    admin page; issue #46), each built once (kit/db.py ``compiled_read``). An account whose
    chain leaves the tree, loops or is too deep is asked alone, which raises as it always did."""
    if tree is None:
        parent_of = dict(compiled_read(session, "accounts.parents", _parents).tuples(session, {}))
    else:
        parent_of = {a.name: a.parent_name for a in tree.values()}
    rows = {q.account_name: q for q in compiled_read(session, "accounts.quotas", _all_quotas).rows(session, {})}
    pool_rows: dict[str, list[Any]] = {}
    for row in compiled_read(session, "accounts.pool_quotas", _all_pool_quotas).rows(session, {}):
        pool_rows.setdefault(row.account_name, []).append(row)
    out = {}
    for name in parent_of:
        accounts = walk_up(parent_of, name)
        out[name] = effective_quota(session, name) if accounts is None else _effective(
            list(accounts), rows, [r for acc in accounts for r in pool_rows.get(acc, ())])
    return out


def _effective(accounts: list[str], rows: dict[str, AccountQuota], pool_rows: list[AccountPoolQuota]) -> dict[str, Any]:
    """The limits of the last of ``accounts`` (a chain, root first) from its quota rows."""
    out: dict[str, Any] = {}
    for field in QUOTA_FIELDS:
        out[field] = EffectiveLimit(None, None)
        for acc in reversed(accounts):
            q = rows.get(acc)
            if q is not None and getattr(q, field) is not None:
                out[field] = EffectiveLimit(getattr(q, field), acc)
                break
    for field, column in PER_POOL:
        per_pool: dict[str, EffectiveLimit] = {}
        for row in pool_rows:
            value, acc, pool = getattr(row, column), row.account_name, row.pool
            if value is None:
                continue
            if pool not in per_pool or accounts.index(acc) > accounts.index(per_pool[pool].source):
                per_pool[pool] = EffectiveLimit(value, acc)  # the nearest (deepest) account's value
        out[field] = dict(sorted(per_pool.items()))
    src = out["budget_gpu_seconds"].source
    q = rows.get(src) if src else None
    out["budget_period"] = q.budget_period if q else None
    out["budget_window_days"] = q.budget_window_days if q else None
    return out


def _check_name(name: str, field: str) -> None:
    if not ACCOUNT_NAME.fullmatch(name):
        raise Invalid(field, f"must match {ACCOUNT_NAME_RE}")


def quota_of(session: Session, name: str) -> dict[str, Any] | None:
    """An account's own quotas (limits, guarantees, budget, per-pool values) as plain values,
    None when it has none set: what the audit log records before and after a change."""
    q = session.get(AccountQuota, name)
    per_pool = {r.pool: {"max_gpus": r.max_gpus, "guaranteed_gpus": r.guaranteed_gpus}
                for r in session.scalars(select(AccountPoolQuota).where(AccountPoolQuota.account_name == name)
                                         .order_by(AccountPoolQuota.pool))}
    if q is None and not per_pool:
        return None
    own = {f: getattr(q, f) for f in QUOTA_FIELDS} if q is not None else dict.fromkeys(QUOTA_FIELDS)
    own.update(budget_period=q.budget_period if q else None, budget_window_days=q.budget_window_days if q else None,
               per_pool=per_pool)
    return own


def set_quota(session: Session, *, name: str, values: dict[str, Any], by: Who) -> AccountQuota:
    """Set (or with None, unset) limits. Fields absent from ``values`` are left alone."""
    from gateway.pools.service import require_known

    actor = by.subject
    get_or_raise(session, name=name)
    before = quota_of(session, name)
    values = dict(values)
    for field, column in PER_POOL:
        per_pool = values.pop(field, None) or {}
        for pool, value in per_pool.items():
            require_known(session, pool, f"body.{field}.{pool}")
            if value is not None and not 0 <= value <= MAX_POOL_GPUS:
                raise Invalid(f"body.{field}.{pool}", f"must be between 0 and {MAX_POOL_GPUS} (null removes it)")
        for pool, value in per_pool.items():
            row = session.get(AccountPoolQuota, (name, pool))
            if row is None:
                if value is None:
                    continue
                row = AccountPoolQuota(account_name=name, pool=pool)
                session.add(row)
            setattr(row, column, value)
            row.updated_at, row.updated_by = utcnow(), actor
            if row.max_gpus is None and row.guaranteed_gpus is None:
                session.delete(row)
            elif row.max_gpus is not None and row.guaranteed_gpus is not None and row.guaranteed_gpus > row.max_gpus:
                raise Invalid(f"body.{field}.{pool}", f"{name}'s guarantee in pool {pool} ({row.guaranteed_gpus}) "
                                                      f"exceeds its limit there ({row.max_gpus})")
    for field, value in values.items():
        if field in QUOTA_MAX and value is not None:
            if value < 0:
                raise Invalid(f"body.{field}", "must be >= 0 (null removes the limit)")
            if value > QUOTA_MAX[field]:
                raise Invalid(f"body.{field}", f"{value} is absurd (at most {QUOTA_MAX[field]})")
    if values.get("budget_period") not in (None, "month", "rolling"):
        raise Invalid("body.budget_period", "must be 'month' or 'rolling'")
    wd = values.get("budget_window_days")
    if wd is not None and not 1 <= wd <= 366:
        raise Invalid("body.budget_window_days", "must be between 1 and 366")
    q = session.get(AccountQuota, name)
    if q is None:
        q = AccountQuota(account_name=name, budget_period="month", budget_window_days=30)
        session.add(q)
    for field, value in values.items():
        if field in ("budget_period", "budget_window_days") and value is None:
            continue
        setattr(q, field, value)
    if q.max_gpus is not None and q.guaranteed_gpus is not None and q.guaranteed_gpus > q.max_gpus:
        field = "guaranteed_gpus" if "guaranteed_gpus" in values else "max_gpus"
        raise Invalid(f"body.{field}", f"{name}'s guarantee ({q.guaranteed_gpus} GPUs) exceeds its limit "
                                       f"({q.max_gpus} GPUs)")
    q.updated_at = utcnow()
    q.updated_by = actor
    session.flush()
    audit.record(session, by=by, action="account.quota.set", target_kind="account", target_name=name,
                 account=name, before=before, after=quota_of(session, name))
    return q


def set_member(session: Session, *, name: str, username: str, role: str, by: Who) -> AccountMember:
    """Record ``username`` as a member or coordinator of ``name`` (or change their role)."""
    get_or_raise(session, name=name)
    m = session.get(AccountMember, (name, username))
    before = None if m is None else {"username": username, "role": m.role}
    if m is None:
        m = AccountMember(account_name=name, username=username, role=role, created_at=utcnow())
        session.add(m)
    else:
        m.role = role
    session.flush()
    audit.record(session, by=by, action="account.member.set", target_kind="member", target_name=username,
                 account=name, before=before, after={"username": username, "role": role})
    return m


def remove_member(session: Session, *, name: str, username: str, by: Who) -> None:
    get_or_raise(session, name=name)
    m = session.get(AccountMember, (name, username))
    if m is None:
        raise NotFound(f"{username!r} is not a recorded member of {name!r}")
    before = {"username": username, "role": m.role}
    session.delete(m)
    session.flush()
    audit.record(session, by=by, action="account.member.remove", target_kind="member", target_name=username,
                 account=name, before=before, after=None)


def members(session: Session, name: str) -> list[AccountMember]:
    return list(session.scalars(select(AccountMember).where(AccountMember.account_name == name)
                                .order_by(AccountMember.username)))


def visible_accounts(session: Session, *, accounts: frozenset[str], username: str, is_admin: bool) -> list[str]:
    """Accounts a caller may look at: all for admins; else the token's accounts plus the
    subtrees of accounts where the caller is a recorded coordinator.

    Every dashboard page asks this: the accounts' names and parents as plain rows and the
    caller's coordinator rows, each a statement built once (kit/db.py ``compiled_read``), not
    the account table as ORM objects (issue #46)."""
    parent_of = dict(compiled_read(session, "accounts.parents", _parents).tuples(session, {}))
    if is_admin:
        return sorted(parent_of)
    names = {a for a in accounts if a in parent_of}
    if username:
        kids: dict[str | None, list[str]] = {}
        for name, parent in parent_of.items():  # as children_map: a parent not in the table is a root
            kids.setdefault(parent if parent in parent_of else None, []).append(name)
        for v in kids.values():
            v.sort()
        for (acc,) in compiled_read(session, "accounts.coordinated", _coordinated).tuples(session, {"username": username}):
            if acc in parent_of:
                names.update(_descendants(kids, acc))
    return sorted(names)


def _parents():
    return select(Account.name, Account.parent_name)


def _coordinated():
    return select(AccountMember.account_name).where(AccountMember.username == bindparam("username"),
                                                    AccountMember.role == "coordinator")


def names(session: Session) -> set[str]:
    """Every account's name."""
    return set(session.scalars(select(Account.name)))


def chains(session: Session, accounts: list[str]) -> dict[str, list[str]]:
    """Each existing account of ``accounts`` -> its ancestors' names, root first (a storage
    allowed to an account is allowed to its subtree)."""
    if not accounts:
        return {}
    parent_of = dict(session.execute(select(Account.name, Account.parent_name)).all())
    out = {}
    for name in accounts:
        chain = walk_up(parent_of, name)
        if chain is not None:
            out[name] = [a for a in chain if a != name]
    return out


def exists(session: Session, name: str) -> bool:
    return session.get(Account, name) is not None


def forget(session: Session, name: str) -> None:
    """Drop a deleted account's quotas and members (gateway/admin/lifecycle.py)."""
    from sqlalchemy import delete

    for model in (AccountPoolQuota, AccountQuota, AccountMember):
        session.execute(delete(model).where(model.account_name == name).execution_options(synchronize_session="fetch"))
