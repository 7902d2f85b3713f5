"""HTTP only: /v1/admin/nodes, the node-health record (docs/recovery.md, "Node health")."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from gateway.accounts.schemas import POOL_NAME_PATTERN
from gateway.identity.dependency import require_admin
from gateway.identity.principal import Principal
from gateway.kit.db import get_session, transaction
from gateway.kit.errors import problem_responses
from gateway.kit.names import NODE_NAME_RE
from gateway.kit.timeutil import utcnow
from gateway.pools import nodehealth

router = APIRouter(prefix="/v1/admin/nodes", tags=["admin"], dependencies=[Depends(require_admin)])

PoolName = Annotated[str, Path(pattern=POOL_NAME_PATTERN, max_length=63, description="The pool's name.")]
NodeName = Annotated[str, Path(pattern=NODE_NAME_RE, description="The node's name, as its backend spells it.")]


class NodeOut(BaseModel):
    pool: str
    node: str
    suspect: bool = Field(description="true: quarantined: the gateway places no gang on it")
    reason: str = Field(description="why, in words")
    by_backend: bool = Field(description="true: suspect because its backend has it out of service")
    failures: int = Field(description="infrastructure failures on it within the rule's window")
    accounts: list[str] = Field(description="whose attempts those failures ended")
    last_failure: datetime | None
    lost_gpu_hours: float = Field(description="GPU-hours of the failed attempts blamed on it (last 30 days)")
    suspect_since: datetime | None = Field(description="when the gateway found it suspect by its failures")
    drained_at: datetime | None = Field(description="when the gateway drained (Slurm) or cordoned (Kubernetes) it")
    drain_error: str = Field(description="why a drain the gateway tried failed (\"\": none)")
    cleared_at: datetime | None = Field(description="when an admin last cleared it")
    cleared_by: str


def _out(n: nodehealth.NodeView) -> NodeOut:
    v = n.verdict
    return NodeOut(pool=v.pool, node=v.node, suspect=v.suspect, reason=v.reason, by_backend=v.by_backend,
                   failures=v.failures, accounts=list(v.accounts), last_failure=v.last_failure,
                   lost_gpu_hours=round(v.lost_gpu_seconds / 3600.0, 4), suspect_since=n.suspect_since,
                   drained_at=n.drained_at, drain_error=n.drain_error, cleared_at=n.cleared_at,
                   cleared_by=n.cleared_by)


def _down(request: Request) -> dict:
    dispatcher = getattr(request.app.state, "dispatcher", None)
    return dict(dispatcher.node_watch.down) if dispatcher is not None else {}


@router.get("", response_model=list[NodeOut], operation_id="listNodes", summary="The node-health record",
            description="Every node an attempt ran on and ended with a failure (last 30 days), every node found "
                        "suspect, and every node its backend has out of service: suspect ones first, then by "
                        "GPU-hours lost. docs/recovery.md, \"Node health\".",
            responses=problem_responses(401, 403, 422))
def list_nodes(request: Request, pool: Annotated[str | None, Query(pattern=POOL_NAME_PATTERN, max_length=63)] = None,
               suspect: bool | None = None,
               session: Session = Depends(get_session, scope="function")) -> list[NodeOut]:
    down = _down(request)
    views = nodehealth.listing(session, now=utcnow(), thresholds=nodehealth.thresholds_of(request.app.state.settings),
                               pool=pool, backend_down=down)
    return [_out(n) for n in views if suspect is None or n.verdict.suspect == suspect]


@router.post("/{pool}/{node}/clear", response_model=NodeOut, operation_id="clearNode",
             summary="Clear a node: back in service",
             description="Failures before now no longer count against the node and its quarantine ends; a node the "
                         "gateway drained or cordoned is resumed in its backend. A node its backend itself has out of "
                         "service stays so until the backend returns it.",
             responses=problem_responses(401, 403, 404, 422))
def clear_node(pool: PoolName, node: NodeName, request: Request, principal: Principal = Depends(require_admin)) -> NodeOut:
    db = request.app.state.db
    now = utcnow()
    nodehealth.clear_and_resume(db.sessions, request.app.state.backends, pool, node, by=principal.who, now=now)
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is not None:
        dispatcher.node_watch.invalidate()
        dispatcher.capacity.invalidate()
    with transaction(db.sessions) as s:
        views = nodehealth.listing(s, now=now, thresholds=nodehealth.thresholds_of(request.app.state.settings),
                                   pool=pool, backend_down=_down(request))
    mine = [n for n in views if n.verdict.node == node]
    if mine:
        return _out(mine[0])
    return NodeOut(pool=pool, node=node, suspect=False, reason=f"cleared by {principal.subject}", by_backend=False,
                   failures=0, accounts=[], last_failure=None, lost_gpu_hours=0.0, suspect_since=None,
                   drained_at=None, drain_error="", cleared_at=now, cleared_by=principal.subject)
