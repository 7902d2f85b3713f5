"""Node health, read and acted on (issue #48, docs/recovery.md "Node health").

The rule is gateway/domain/nodehealth.py; the record is ``attempt_end`` (written with each
attempt's end: gateway/jobs/node_record.py). This module reads the record for the rule, keeps
``node_standing`` (its one writer: a node found suspect, drained by the gateway, cleared by an
admin) and says what a gang must avoid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from adapters.base import BackendError, Feature, features_of
from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.domain import nodehealth
from gateway.domain.nodehealth import Node, Thresholds, Verdict
from gateway.kit.db import transaction
from gateway.kit.errors import NotFound
from gateway.kit.timeutil import as_utc
from gateway.models.nodes import AttemptEnd, NodeStanding

# Failures older than this are not read: a node found suspect stays so through its
# ``node_standing`` row (until cleared), not through old failures.
RECORD_HORIZON = timedelta(days=30)
GATEWAY_REASON = "isthmus:"  # how the gateway's own drains and cordons are worded


def thresholds_of(settings) -> Thresholds:
    """The rule's settings (``ISTHMUS_NODE_HEALTH_*``)."""
    return Thresholds(window_s=settings.node_health_window_s, min_accounts=settings.node_health_min_accounts,
                      avoid_s=settings.node_health_avoid_s, quiet_s=settings.node_health_quiet_s or None)


def as_end(row: AttemptEnd) -> nodehealth.AttemptEnd:
    """A record row as the rule takes it."""
    return nodehealth.AttemptEnd(job_id=row.job_id, account=row.account_name, pool=row.pool,
                                 nodes=tuple(row.nodes or ()), ended_at=as_utc(row.ended_at), outcome=row.outcome,
                                 charged_gpu_seconds=int(row.charged_gpu_seconds or 0),
                                 failed_nodes=tuple(row.failed_nodes or ()))


def failures(session: Session, *, now: datetime) -> list[nodehealth.AttemptEnd]:
    """Every infrastructure failure on record within RECORD_HORIZON, oldest first."""
    rows = session.scalars(select(AttemptEnd).where(AttemptEnd.outcome.in_(nodehealth.INFRASTRUCTURE),
                                                    AttemptEnd.ended_at >= now - RECORD_HORIZON)
                           .order_by(AttemptEnd.ended_at))
    return [as_end(r) for r in rows]


def standings(session: Session) -> dict[Node, NodeStanding]:
    return {(r.pool, r.node): r for r in session.scalars(select(NodeStanding))}


def health(session: Session, *, now: datetime, thresholds: Thresholds,
           backend_down: Mapping[Node, str] | None = None) -> dict[Node, Verdict]:
    """Every node's verdict now: the rule over the record, the admins' clears, the earlier
    quarantines (``suspect_since``) and what the backends say (``backend_down``, less the
    nodes the gateway itself took out of service)."""
    rows = standings(session)
    cleared = {k: as_utc(r.cleared_at) for k, r in rows.items() if r.cleared_at is not None}
    suspected = {k: as_utc(r.suspect_since) for k, r in rows.items() if r.suspect_since is not None}
    ours = {k for k, r in rows.items() if r.drained_at is not None}
    down = {k: why for k, why in (backend_down or {}).items() if k not in ours and GATEWAY_REASON not in why}
    return nodehealth.verdicts(failures(session, now=now), now=now, thresholds=thresholds, cleared=cleared,
                               backend_down=down, suspected=suspected)


def note(session: Session, verdicts: Mapping[Node, Verdict], *, now: datetime) -> list[Verdict]:
    """Keep each node's standing in step with its verdict; returns the nodes newly found suspect
    by their failures (a backend's own verdict is the backend's: it is not kept)."""
    rows = standings(session)
    newly = []
    for key, v in verdicts.items():
        row = rows.get(key)
        if v.suspect and not v.by_backend:
            if row is None:
                row = NodeStanding(pool=key[0], node=key[1], cleared_by="", reason="", drain_error="")
                session.add(row)
            if row.suspect_since is None:
                row.suspect_since, row.reason = now, v.reason
                newly.append(v)
        elif row is not None and row.suspect_since is not None and not v.suspect:
            row.suspect_since = None  # cleared itself (quiet time)
            row.reason = v.reason
    return newly


def mark_drained(session: Session, pool: str, node: str, *, at: datetime | None, error: str = "") -> None:
    """The gateway drained (``at``) or could not drain (``error``) the node in its backend."""
    row = session.get(NodeStanding, (pool, node))
    if row is None:
        row = NodeStanding(pool=pool, node=node, cleared_by="", reason="", drain_error="")
        session.add(row)
    before = {"drained_at": row.drained_at, "drain_error": row.drain_error}
    row.drained_at, row.drain_error = at, error[:1000]
    if at is not None:  # a change made in the backend: on the audit log (docs/ledger.md)
        audit.record(session, by=Who.system("node-health"), action="pool.node.drain", target_kind="node",
                     target_name=f"{pool}/{node}", before=before, after={"drained_at": at, "reason": row.reason})


def undrained(session: Session) -> list[Node]:
    """Suspect nodes a drain was tried on and failed (``drain_error`` set, not drained)."""
    rows = session.scalars(select(NodeStanding).where(NodeStanding.suspect_since.is_not(None),
                                                      NodeStanding.drained_at.is_(None),
                                                      NodeStanding.drain_error != ""))
    return [(r.pool, r.node) for r in rows]


@dataclasses.dataclass(frozen=True)
class Cleared:
    pool: str
    node: str
    drained_by_gateway: bool  # the caller resumes it in its backend


def clear(session: Session, pool: str, node: str, *, by: Who, now: datetime) -> Cleared:
    """An admin clears a node: failures before now no longer count, its quarantine ends."""
    row = session.get(NodeStanding, (pool, node), with_for_update=True)
    known = row is not None or session.scalar(select(AttemptEnd.id).where(AttemptEnd.pool == pool).limit(1))
    if not known:
        raise NotFound(f"no node {node!r} of pool {pool!r} on the node-health record")
    if row is None:
        row = NodeStanding(pool=pool, node=node, cleared_by="", reason="", drain_error="")
        session.add(row)
    drained = row.drained_at is not None
    before = {"suspect_since": row.suspect_since, "reason": row.reason, "drained_at": row.drained_at}
    row.cleared_at, row.cleared_by, row.suspect_since = now, by.subject[:255], None
    row.reason, row.drained_at, row.drain_error = f"cleared by {by.subject}", None, ""
    audit.record(session, by=by, action="pool.node.clear", target_kind="node", target_name=f"{pool}/{node}",
                 before=before, after={"cleared_at": now, "resumed_in_backend": drained})
    return Cleared(pool, node, drained)


@dataclasses.dataclass(frozen=True)
class NodeView:
    """A node as admins see it: its verdict and what was done about it."""

    verdict: Verdict
    drained_at: datetime | None
    drain_error: str
    cleared_at: datetime | None
    cleared_by: str
    suspect_since: datetime | None


def listing(session: Session, *, now: datetime, thresholds: Thresholds, pool: str | None = None,
            backend_down: Mapping[Node, str] | None = None) -> list[NodeView]:
    """Every node on the record (of ``pool``), suspect ones first, then by GPU-hours lost."""
    verdicts = health(session, now=now, thresholds=thresholds, backend_down=backend_down)
    rows = standings(session)
    out = []
    for key, v in verdicts.items():
        if pool is not None and key[0] != pool:
            continue
        r = rows.get(key)
        out.append(NodeView(v, as_utc(r.drained_at) if r else None, r.drain_error if r else "",
                            as_utc(r.cleared_at) if r else None, r.cleared_by if r else "",
                            as_utc(r.suspect_since) if r else None))
    return sorted(out, key=lambda n: (not n.verdict.suspect, -n.verdict.lost_gpu_seconds, n.verdict.pool,
                                      n.verdict.node))


def clear_and_resume(sessions, backends: Mapping, pool: str, node: str, *, by: Who, now: datetime) -> None:
    """:func:`clear` committed, then the node resumed in its backend when the gateway had
    drained it there (a failed resume is kept on its standing, for the admins to see)."""
    with transaction(sessions) as s:
        done = clear(s, pool, node, by=by, now=now)
    backend = backends.get(pool)
    if not done.drained_by_gateway or backend is None or not features_of(backend).has(Feature.NODE_DRAIN):
        return
    try:
        backend.resume_node(node)
    except BackendError as exc:
        with transaction(sessions) as s:
            mark_drained(s, pool, node, at=now, error=f"resume failed: {exc.message}")


def quarantined_now(session: Session) -> dict[str, list[str]]:
    """pool -> the nodes the gateway holds quarantined for their failures (its standing, as the
    last dispatch round left it): what any user's pool list shows, without the reasons (they
    name accounts; admins read them at /v1/admin/nodes)."""
    out: dict[str, list[str]] = {}
    for row in session.scalars(select(NodeStanding).where(NodeStanding.suspect_since.is_not(None))
                               .order_by(NodeStanding.pool, NodeStanding.node)):
        out.setdefault(row.pool, []).append(row.node)
    return out


def lost_by_node(session: Session, *, now: datetime) -> dict[Node, float]:
    """GPU-seconds each node's blamed failures cost within RECORD_HORIZON (metrics)."""
    return {k: v.lost_gpu_seconds for k, v in nodehealth.verdicts(failures(session, now=now), now=now).items()
            if v.lost_gpu_seconds > 0}


def quarantined(verdicts: Mapping[Node, Verdict]) -> dict[str, dict[str, str]]:
    """pool -> {node: why} of every suspect node: no gang is placed on them."""
    out: dict[str, dict[str, str]] = {}
    for (pool, node), v in verdicts.items():
        if v.suspect:
            out.setdefault(pool, {})[node] = v.reason
    return out


def avoided_by(session: Session, job_id: str, *, now: datetime, thresholds: Thresholds) -> set[Node]:
    """The nodes a retry of ``job_id`` avoids (the rule's ``avoided`` over its own failures)."""
    if thresholds.avoid_s <= 0:
        return set()
    rows = session.scalars(select(AttemptEnd).where(AttemptEnd.job_id == job_id,
                                                    AttemptEnd.outcome.in_(nodehealth.INFRASTRUCTURE),
                                                    AttemptEnd.ended_at >= now - timedelta(seconds=thresholds.avoid_s)))
    return nodehealth.avoided([as_end(r) for r in rows], now=now, thresholds=thresholds)

