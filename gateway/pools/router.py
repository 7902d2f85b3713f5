"""HTTP only: /v1/pools."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.identity.dependency import CurrentPrincipal
from gateway.kit.errors import problem_responses
from gateway.pools import service
from gateway.pools.schemas import PoolList, PoolOut

router = APIRouter(prefix="/v1/pools", tags=["pools"])

NO_POOL = "no pool is configured on this gateway (ISTHMUS_BACKENDS); jobs wait in pending until one is"


@router.get("", response_model=PoolList, operation_id="listPools", summary="List pools and their health",
            description="Each configured pool: its kind, whether it can take jobs now and why, and its "
                        "capacity at the last probe (at most `ISTHMUS_CAPACITY_TTL_S` old).",
            responses=problem_responses(401))
def list_pools(request: Request, principal: CurrentPrincipal) -> PoolList:
    dispatcher = getattr(request.app.state, "dispatcher", None)
    items = []
    for name, h in service.current(dispatcher).items():
        v = h.view
        items.append(PoolOut(name=name, kind=h.kind, healthy=h.ok, reason=h.reason, total_nodes=v.total_nodes,
                             idle_nodes=v.idle_nodes, total_gpus=v.total_gpus, free_gpus=v.free_gpus,
                             gpus_per_node=v.gpus_per_node))
    return PoolList(items=items, note="" if items else NO_POOL)
