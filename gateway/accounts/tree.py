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

from gateway.models.accounts import Account

MAX_DEPTH = 16


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


def walk_up(parent_of: Mapping[str, str | None], leaf: str, *, partial: bool = False) -> tuple[str, ...] | None:
    """The account and its ancestors, root first, from a name -> parent map; None when the
    walk leaves the map, meets a cycle or goes deeper than ``MAX_DEPTH`` (with ``partial``:
    the accounts walked until then, for reports that show what they can)."""
    out: list[str] = []
    cur: str | None = leaf
    while cur is not None:
        if cur not in parent_of or cur in out or len(out) >= MAX_DEPTH:
            return tuple(reversed(out)) if partial else None
        out.append(cur)
        cur = parent_of[cur]
    return tuple(reversed(out))


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
