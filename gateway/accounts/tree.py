"""The account tree's walks: the one implementation of "an account and its ancestors" and of
"an account's subtree", in SQL and in memory, with one depth bound.

The tree is at most ``MAX_DEPTH`` levels deep (admin/lifecycle.py refuses deeper). Every
walk stops at ``MAX_DEPTH + 1`` levels, so a walk that returns more than ``MAX_DEPTH``
accounts has met a cycle or a corrupted row and its caller refuses it; none loops forever.
The SQL walks are recursive CTEs built once per statement at import (rebuilding them per
call costs SQLAlchemy cache-key work on hot paths).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import bindparam, literal, select
from sqlalchemy.orm import aliased
from sqlalchemy.sql.elements import BindParameter

from gateway.domain.tree import MAX_DEPTH
from gateway.models.accounts import Account


def up_cte(name: str, leaf: BindParameter | str | None = None):
    """Recursive CTE ``(name, parent, depth)``: the account ``leaf`` (default: the bound
    parameter ``:leaf``) at depth 0 and each ancestor one deeper."""
    leaf = bindparam("leaf") if leaf is None else leaf
    up = (select(Account.name.label("name"), Account.parent_name.label("parent"), literal(0).label("depth"))
          .where(Account.name == leaf).cte(name, recursive=True))
    parent = aliased(Account)
    return up.union_all(select(parent.name, parent.parent_name, up.c.depth + 1)
                        .where(parent.name == up.c.parent, up.c.depth < MAX_DEPTH))


def up_many_cte(name: str, leaves: BindParameter):
    """:func:`up_cte` for many leaves at once (an expanding parameter); an ancestor shared by
    several leaves appears once per leaf."""
    up = (select(Account.name.label("name"), Account.parent_name.label("parent"), literal(0).label("depth"))
          .where(Account.name.in_(leaves)).cte(name, recursive=True))
    parent = aliased(Account)
    return up.union_all(select(parent.name, parent.parent_name, up.c.depth + 1)
                        .where(parent.name == up.c.parent, up.c.depth < MAX_DEPTH))


def subtree_cte(name: str, root: BindParameter | str | None = None):
    """Recursive CTE ``(name, depth)``: ``root`` (default: the bound parameter ``:root``) and
    every account below it."""
    root = bindparam("root") if root is None else root
    sub = (select(Account.name.label("name"), literal(0).label("depth")).where(Account.name == root)
           .cte(name, recursive=True))
    child = aliased(Account)
    return sub.union_all(select(child.name, sub.c.depth + 1)
                         .where(child.parent_name == sub.c.name, sub.c.depth < MAX_DEPTH))


def subtree_names(root: BindParameter | str | None = None, *, name: str = "subtree"):
    """SELECT of the names in ``root``'s subtree (itself included), for ``IN (...)``."""
    return select(subtree_cte(name, root).c.name)


def descendants(children_of: Mapping[str | None, Iterable[str]], root: str) -> list[str]:
    """``root`` and every account below it, from a parent -> children map (depth first)."""
    out: list[str] = []
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        out.append(node)
        if depth < MAX_DEPTH:
            stack.extend((child, depth + 1) for child in children_of.get(node, ()))
    return out
