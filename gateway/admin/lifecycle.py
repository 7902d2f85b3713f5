"""Creating, re-parenting and deleting accounts.

These move the account's ledger rows too (its balance, its subtree's running totals), so
they sit above both the account tree (gateway/accounts/service.py, which imports nothing
from the ledger) and the ledger (gateway/ledger/, which reads the tree). Re-parenting goes
through the ledger's locking so it cannot interleave with a reservation on the same chain.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.accounts.service import (
    _check_name,
    chain,
    children_map,
    descendants,
    get_or_raise,
    load_tree,
)
from gateway.accounts.tree import MAX_DEPTH
from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.domain.states import FINAL_STATES
from gateway.kit.errors import Conflict, Invalid
from gateway.kit.timeutil import utcnow
from gateway.ledger import chains as ledger_chains
from gateway.ledger.service import move_subtree
from gateway.models.accounts import Account
from gateway.models.jobs import Job
from gateway.pools import reservations


def _shown(acc: Account) -> dict[str, Any]:
    """An account's own fields as the audit log records them."""
    return {"name": acc.name, "parent": acc.parent_name, "shares": acc.shares, "description": acc.description or "",
            "priority_class": acc.priority_class}


def create(session: Session, *, name: str, parent_name: str | None, shares: int, by: Who, description: str = "",
           priority_class: str | None = None) -> Account:
    _check_name(name, "body.name")
    if session.get(Account, name) is not None:
        raise Conflict(f"account {name!r} exists")
    if parent_name is not None:
        get_or_raise(session, name=parent_name, field="body.parent")
        if len(chain(session, parent_name)) >= MAX_DEPTH:
            raise Invalid("body.parent", f"the tree may be at most {MAX_DEPTH} levels deep")
    acc = Account(name=name, parent_name=parent_name, shares=shares, description=description,
                  priority_class=priority_class, created_at=utcnow())
    session.add(acc)
    session.flush()
    ledger_chains.open_account(session, name)
    audit.record(session, by=by, action="account.create", target_kind="account", target_name=name, account=name,
                 before=None, after=_shown(acc))
    return acc


def update(session: Session, *, name: str, changes: dict[str, Any], by: Who) -> Account:
    acc = get_or_raise(session, name=name)
    before = _shown(acc)
    if "shares" in changes and changes["shares"] is not None:
        acc.shares = changes["shares"]
    if "description" in changes and changes["description"] is not None:
        acc.description = changes["description"]
    if "priority_class" in changes:  # null: back to the backend's default class
        acc.priority_class = changes["priority_class"]
    if "parent" in changes:
        new_parent = changes["parent"]
        if new_parent != acc.parent_name:
            if new_parent is not None:
                get_or_raise(session, name=new_parent, field="body.parent")
                tree = load_tree(session)
                if new_parent in descendants(tree, name):
                    raise Invalid("body.parent", f"{new_parent!r} is {name!r} or below it: that would make a cycle")
                depth = len(chain(session, new_parent)) + _height(tree, name)
                if depth > MAX_DEPTH:
                    raise Invalid("body.parent", f"the tree may be at most {MAX_DEPTH} levels deep")
            move_subtree(session, account=name, new_parent=new_parent, actor=by.subject)
    session.flush()
    if _shown(acc) != before:
        audit.record(session, by=by, action="account.update", target_kind="account", target_name=name,
                     account=name, before=before, after=_shown(acc))
    return acc


def _height(tree: dict[str, Account], name: str) -> int:
    kids = children_map(tree)

    def h(n: str) -> int:
        return 1 + max((h(k) for k in kids.get(n, [])), default=0)

    return h(name)


def delete(session: Session, *, name: str, by: Who) -> None:
    acc = get_or_raise(session, name=name)
    kids = session.scalar(select(func.count()).select_from(Account).where(Account.parent_name == name))
    if kids:
        raise Conflict(f"account {name!r} has {kids} child account(s); delete or move them first")
    active = session.scalar(select(func.count()).select_from(Job).where(
        Job.account_name == name, Job.state.not_in([s.value for s in FINAL_STATES])))
    if active:
        raise Conflict(f"account {name!r} has {active} active job(s); wait for them or cancel them first")
    history = session.scalar(select(func.count()).select_from(Job).where(Job.account_name == name))
    if history:
        raise Conflict(f"account {name!r} has {history} job(s) in its history; set its shares and quotas "
                       "to 0 instead of deleting it")
    ledger_chains.close_account(session, name)  # refuses while it holds reservations
    before = {**_shown(acc), "quota": accounts.quota_of(session, name),
              "members": {m.username: m.role for m in accounts.members(session, name)}}
    reservations.remove_for_account(session, name, by=by)
    accounts.forget(session, name)
    session.delete(acc)
    session.flush()
    audit.record(session, by=by, action="account.delete", target_kind="account", target_name=name, account=name,
                 before=before, after=None)
