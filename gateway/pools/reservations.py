"""Advance reservations: a pool's GPUs or nodes held for an account (docs/planning.md).

One place for their rules: what a valid one is and which pool "any pool with GPU type X"
means (:func:`create`), which ones the planner holds (:func:`planned`), and whether one can
be honoured (``gateway.domain.windows.shortfall``). The admin API, the CLI and the dispatch
round call these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.domain.routing import PoolView
from gateway.domain.windows import PlannedHold, hold_need
from gateway.kit import signals
from gateway.kit.errors import Invalid, NotFound
from gateway.kit.timeutil import as_utc, new_id
from gateway.models.accounts import Account
from gateway.models.pools import AdvanceReservation, Pool
from gateway.pools import windows

MAX_AMOUNT = 100_000


def choose_pool(session: Session, views: Mapping[str, PoolView], *, gpu_type: str, gpus: int | None,
                nodes: int | None) -> str:
    """"Any pool with GPU type X": the configured pool offering it where the amount fits, the
    largest first (ties by name). The choice is made once, at creation, and stored."""
    wanted = gpu_type.lower()
    fits: list[tuple[int, str]] = []
    offered: list[str] = []
    for row in session.scalars(select(Pool).where(Pool.configured.is_(True)).order_by(Pool.name)):
        view = views.get(row.name)
        types = {t.lower() for t in (row.gpu_types or [])} | {t.lower() for t in (view.gpu_types if view else ())}
        if wanted not in types:
            continue
        offered.append(row.name)
        if view is None or view.capacity is None:
            continue
        need = hold_need(gpus, nodes, view)
        total = view.total_nodes if view.node_exclusive else view.total_gpus
        if need <= total:
            fits.append((-total, row.name))
    if not fits:
        where = f" (pools with it: {', '.join(offered)}; none has room for it)" if offered else ""
        raise Invalid("body.gpu_type", f"no pool can hold this reservation of GPU type {gpu_type!r}{where}")
    return min(fits)[1]


def create(session: Session, views: Mapping[str, PoolView], *, account: str, pool: str | None,
           gpu_type: str | None, gpus: int | None, nodes: int | None, starts_at: datetime, ends_at: datetime,
           reason: str, by: Who, now: datetime) -> AdvanceReservation:
    """A new advance reservation; :class:`Invalid` names the field, and nothing is written."""
    if (gpus is None) == (nodes is None):
        raise Invalid("body.gpus", "give exactly one of gpus and nodes")
    for field, value in (("body.gpus", gpus), ("body.nodes", nodes)):
        if value is not None and not 0 < value <= MAX_AMOUNT:
            raise Invalid(field, f"must be between 1 and {MAX_AMOUNT}")
    if (pool is None) == (gpu_type is None):
        raise Invalid("body.pool", "give exactly one of pool and gpu_type")
    if session.get(Account, account) is None:
        raise Invalid("body.account", f"unknown account {account!r}")
    starts_at, ends_at, reason, _ = windows.check(starts_at=starts_at, ends_at=ends_at, reason=reason, nodes=(),
                                                  now=now)
    if pool is None:
        pool = choose_pool(session, views, gpu_type=gpu_type or "", gpus=gpus, nodes=nodes)
    elif session.get(Pool, pool) is None:
        raise NotFound(f"no pool {pool!r} (GET /v1/admin/pools lists them)")
    row = AdvanceReservation(id=new_id(), pool=pool, account=account, gpus=gpus, nodes=nodes, starts_at=starts_at,
                             ends_at=ends_at, reason=reason, created_by=by.subject, created_at=now)
    session.add(row)
    session.flush()
    audit.record(session, by=by, action="reservation.create", target_kind="reservation", target_name=row.id,
                 account=account, before=None, after=_shown(row), now=now)
    # Every process's dispatcher makes the backend's own at the commit (kit/signals.py).
    signals.notify(session, signals.RESERVATIONS, pool)
    return row


def _shown(row: AdvanceReservation) -> dict:
    """A reservation as the audit log records it."""
    return {"pool": row.pool, "account": row.account, "gpus": row.gpus, "nodes": row.nodes, "start": row.starts_at,
            "end": row.ends_at, "reason": row.reason}


def remove(session: Session, reservation_id: str, *, by: Who) -> str:
    """Delete it; returns its pool."""
    row = session.get(AdvanceReservation, reservation_id)
    if row is None:
        raise NotFound(f"no advance reservation {reservation_id!r}")
    before, account = _shown(row), row.account
    pool = session.scalar(delete(AdvanceReservation).where(AdvanceReservation.id == reservation_id)
                          .returning(AdvanceReservation.pool).execution_options(synchronize_session="fetch"))
    if pool is None:
        raise NotFound(f"no advance reservation {reservation_id!r}")
    audit.record(session, by=by, action="reservation.remove", target_kind="reservation", target_name=reservation_id,
                 account=account, before=before, after=None)
    signals.notify(session, signals.RESERVATIONS, pool)
    return pool


def remove_for_account(session: Session, account: str, *, by: Who) -> None:
    """Delete every advance reservation of an account being deleted (gateway/admin/lifecycle.py)."""
    held = list(session.scalars(select(AdvanceReservation).where(AdvanceReservation.account == account)
                                .order_by(AdvanceReservation.id)))
    shown = {r.id: _shown(r) for r in held}
    pools = set(session.scalars(delete(AdvanceReservation).where(AdvanceReservation.account == account)
                                .returning(AdvanceReservation.pool).execution_options(synchronize_session="fetch")))
    for reservation_id, before in shown.items():
        audit.record(session, by=by, action="reservation.remove", target_kind="reservation",
                     target_name=reservation_id, account=account, before=before, after=None)
    for pool in sorted(pools):
        signals.notify(session, signals.RESERVATIONS, pool)


# The one commit in the middle of a request, and why: an admin's new or deleted reservation
# is made in (or removed from) the backend before the answer (Slurm: a real reservation),
# by the dispatcher's sync (gateway/dispatch/holds.py). That sync reads the registry and
# writes the row's ``native`` note in a transaction of its own, so it must see the change
# committed, and on SQLite (one writer) the request's open write would hold it off. So these
# two commit, call ``sync(pool)``, and only then is the answer shaped. ``sync`` is None where
# this process runs no dispatcher: the change's signal (create/remove above) has every
# running dispatcher do it at the commit, and their 15 s pass is the fallback.


def create_synced(session: Session, views: Mapping[str, PoolView], *, sync: Callable[[str], None] | None,
                  **fields) -> AdvanceReservation:
    """:func:`create` (``fields`` are its arguments), committed, then made in the backend by
    ``sync``; returns the row as the sync left it (with its ``native`` name or note)."""
    row = create(session, views, **fields)
    session.commit()
    if sync is not None:
        sync(row.pool)
    session.refresh(row)
    return row


def remove_synced(session: Session, reservation_id: str, *, sync: Callable[[str], None] | None, by: Who) -> None:
    """:func:`remove`, committed, then the backend's own reservation deleted by ``sync``."""
    pool = remove(session, reservation_id, by=by)
    session.commit()
    if sync is not None:
        sync(pool)


def planned_of(r: AdvanceReservation) -> PlannedHold:
    """A stored reservation as the planner and the pages see it."""
    return PlannedHold(id=r.id, pool=r.pool, account=r.account, start=as_utc(r.starts_at), end=as_utc(r.ends_at),
                       gpus=r.gpus, nodes=r.nodes, reason=r.reason, by=r.created_by, native=r.native or "",
                       native_note=r.native_note or "")


def planned(session: Session, *, now: datetime) -> list[PlannedHold]:
    """Every reservation that has not ended, by start."""
    rows = session.scalars(select(AdvanceReservation).where(AdvanceReservation.ends_at > now)
                           .order_by(AdvanceReservation.starts_at, AdvanceReservation.id)).all()
    return [planned_of(r) for r in rows]
