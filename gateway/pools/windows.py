"""Maintenance windows on pools: the admins' own (the ``pool_window`` table) and the backends'.

One place for every rule of a window: what a valid one is (:func:`create`), which ones the
planner sees (:func:`for_round`: the gateway's that have not ended plus the backends' own in
the round's snapshot) and how a window is shown (:func:`shown`). The dispatch round, the
admin API, the CLI, the dashboard and ``GET /v1/pools`` all call these (docs/planning.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import Integer, String, cast, delete, literal, null, select, union_all
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.domain.routing import PoolView
from gateway.domain.windows import FAR, PlannedHold, PlannedWindow, from_backend
from gateway.kit import signals
from gateway.kit.errors import Invalid, NotFound
from gateway.kit.names import NODE_NAME
from gateway.kit.timeutil import as_utc, new_id
from gateway.models.pools import AdvanceReservation, Pool, PoolWindow

MAX_NODES = 1000
MAX_LENGTH = timedelta(days=366)  # longer is a decommission: drain or disable the pool instead
REASON_MAX = 200


def check(*, starts_at: datetime, ends_at: datetime, reason: str, nodes: Iterable[str],
          now: datetime) -> tuple[datetime, datetime, str, list[str]]:
    """The window's fields, checked and normalised; :class:`Invalid` names the field."""
    if starts_at.tzinfo is None:
        raise Invalid("body.start", "give a time zone (e.g. 2026-12-08T06:00:00Z)")
    if ends_at.tzinfo is None:
        raise Invalid("body.end", "give a time zone (e.g. 2026-12-08T10:00:00Z)")
    if ends_at <= starts_at:
        raise Invalid("body.end", "must be after start")
    if ends_at <= now:
        raise Invalid("body.end", "is in the past: a window that has ended changes nothing")
    if ends_at - starts_at > MAX_LENGTH:
        raise Invalid("body.end", "a window lasts at most 366 days (drain or disable the pool instead)")
    reason = reason.strip()
    if not reason:
        raise Invalid("body.reason", "say why (it is shown to the users whose jobs wait)")
    if len(reason) > REASON_MAX or any(ord(c) < 32 for c in reason):
        raise Invalid("body.reason", f"at most {REASON_MAX} printable characters on one line")
    out: list[str] = []
    for i, node in enumerate(nodes):
        if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
            raise Invalid(f"body.nodes.{i}", "must be a node's host name (letters, digits, '.', '_', '-')")
        if node in out:
            raise Invalid(f"body.nodes.{i}", f"{node!r} is listed twice")
        out.append(node)
    if len(out) > MAX_NODES:
        raise Invalid("body.nodes", f"at most {MAX_NODES} nodes (leave it empty for the whole pool)")
    return starts_at, ends_at, reason, out


def create(session: Session, pool: str, *, starts_at: datetime, ends_at: datetime, reason: str,
           nodes: Iterable[str], by: Who, now: datetime) -> PoolWindow:
    """A new window on ``pool`` (which must be one the gateway knows)."""
    if session.get(Pool, pool) is None:
        raise NotFound(f"no pool {pool!r} (GET /v1/admin/pools lists them)")
    starts_at, ends_at, reason, nodes = check(starts_at=starts_at, ends_at=ends_at, reason=reason,
                                              nodes=nodes, now=now)
    row = PoolWindow(id=new_id(), pool=pool, starts_at=starts_at, ends_at=ends_at, reason=reason,
                     nodes=nodes, created_by=by.subject, created_at=now)
    session.add(row)
    session.flush()
    audit.record(session, by=by, action="pool.window.create", target_kind="window", target_name=row.id,
                 before=None, after=_shown(row), now=now)
    signals.notify(session, signals.POOL, pool)  # every process's snapshot and dispatcher, at the commit
    return row


def _shown(row: PoolWindow) -> dict:
    """A window as the audit log records it."""
    return {"pool": row.pool, "start": row.starts_at, "end": row.ends_at, "reason": row.reason,
            "nodes": list(row.nodes or [])}


def remove(session: Session, pool: str, window_id: str, *, by: Who) -> None:
    """Delete a gateway window; a backend's own is deleted in the backend (scontrol)."""
    row = session.get(PoolWindow, window_id)
    before = _shown(row) if row is not None and row.pool == pool else None
    done = session.execute(delete(PoolWindow).where(PoolWindow.pool == pool, PoolWindow.id == window_id))
    if not done.rowcount:
        raise NotFound(f"pool {pool!r} has no window {window_id!r} made through the gateway "
                       "(a backend's own reservation is deleted in the backend)")
    audit.record(session, by=by, action="pool.window.remove", target_kind="window", target_name=window_id,
                 before=before, after=None)
    signals.notify(session, signals.POOL, pool)


def planned_of(window_id: str, pool: str, starts_at: datetime, ends_at: datetime, nodes: Iterable[str],
               reason: str) -> PlannedWindow:
    """A stored window (a row, or a round's read of one) as the planner and the pages see it."""
    return PlannedWindow(pool=pool, start=as_utc(starts_at), end=as_utc(ends_at), nodes=tuple(nodes or ()),
                         maintenance=True, reason=reason, source="gateway", name=window_id)


def _backends(views: Mapping[str, PoolView], now: datetime) -> list[PlannedWindow]:
    return [w for w in from_backend(views) if w.end > now]


def shown(session: Session, views: Mapping[str, PoolView], *, now: datetime,
          pool: str | None = None) -> list[PlannedWindow]:
    """The windows of ``pool`` (or every pool) that have not ended, both sources, by start."""
    stmt = select(PoolWindow).where(PoolWindow.ends_at > now)
    if pool is not None:
        stmt = stmt.where(PoolWindow.pool == pool)
        views = {k: v for k, v in views.items() if k == pool}
    out = [planned_of(r.id, r.pool, r.starts_at, r.ends_at, r.nodes, r.reason) for r in session.scalars(stmt)]
    return sorted(out + _backends(views, now), key=lambda w: (w.start, w.pool, w.name))


def is_open_ended(w: PlannedWindow) -> bool:
    return w.end >= FAR


def for_round(session: Session, views: Mapping[str, PoolView], *, now: datetime) -> tuple[list[PlannedWindow],
                                                                                         list[PlannedHold]]:
    """The windows (the gateway's and the backends' own) and advance reservations a dispatch
    round plans with, read in ONE statement (tests/dispatch/test_round_cost.py counts a round's)."""
    w, r = PoolWindow, AdvanceReservation
    stmt = union_all(
        select(literal("w").label("kind"), w.id, w.pool, cast(null(), String).label("account"), w.starts_at,
               w.ends_at, w.reason, cast(w.nodes, String).label("names"), cast(null(), Integer).label("gpus"),
               cast(null(), Integer).label("nodes_n"), w.created_by, cast(null(), String).label("native"))
        .where(w.ends_at > now),
        select(literal("r"), r.id, r.pool, r.account, r.starts_at, r.ends_at, r.reason, cast(null(), String),
               r.gpus, r.nodes, r.created_by, r.native).where(r.ends_at > now))
    windows_: list[PlannedWindow] = []
    holds_: list[PlannedHold] = []
    for kind, id_, pool, account, start, end, reason, names, gpus, nodes_n, by, native in session.execute(stmt).all():
        if kind == "w":
            windows_.append(planned_of(id_, pool, start, end, json.loads(names) if names else (), reason))
        else:
            holds_.append(PlannedHold(id=id_, pool=pool, account=account, start=as_utc(start), end=as_utc(end),
                                      gpus=gpus, nodes=nodes_n, reason=reason, by=by, native=native or ""))
    return windows_ + _backends(views, now), sorted(holds_, key=lambda h: (h.start, h.id))
