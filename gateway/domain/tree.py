"""The account tree in memory: the one walk of "an account and its ancestors" over a
name -> parent map, and the one depth bound (gateway/accounts/tree.py has the SQL walks)."""

from __future__ import annotations

from collections.abc import Mapping

MAX_DEPTH = 16


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
