"""HTTP only: /v1/pools (any user) and /v1/admin/pools (admins)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.accounts.schemas import POOL_NAME_PATTERN
from gateway.identity.dependency import CurrentPrincipal, require_admin
from gateway.identity.principal import Principal
from gateway.kit.db import get_session
from gateway.kit.errors import NotFound, problem_responses
from gateway.kit.timeutil import utcnow
from gateway.pools import service
from gateway.models.pools import Pool
from gateway.pools.schemas import AdminPoolOut, PoolList, PoolOut, PoolPatch, StorageList, StorageOut, StoragePoolOut

router = APIRouter(prefix="/v1/pools", tags=["pools"])
admin_router = APIRouter(prefix="/v1/admin/pools", tags=["admin"], dependencies=[Depends(require_admin)])
storage_router = APIRouter(prefix="/v1/storage", tags=["pools"])

PoolName = Annotated[str, Path(pattern=POOL_NAME_PATTERN, max_length=63, description="The pool's name.")]


@router.get("", response_model=PoolList, operation_id="listPools", summary="List pools and their health",
            description="Each configured pool: its kind, state, GPU types, weight and cost, whether it can take "
                        "jobs now and why, its queue depth and its capacity at the last probe (at most "
                        "`ISTHMUS_CAPACITY_TTL_S` old).",
            responses=problem_responses(401))
def list_pools(request: Request, principal: CurrentPrincipal) -> PoolList:
    dispatcher = getattr(request.app.state, "dispatcher", None)
    items = []
    for name, h in service.current(dispatcher).items():
        v = h.view
        items.append(PoolOut(name=name, kind=v.kind, state=v.state, healthy=h.ok, reason=h.reason,
                             gpu_types=sorted(v.gpu_types), weight=v.weight, cost=v.cost, queue_depth=v.queue_depth,
                             total_nodes=v.total_nodes, idle_nodes=v.idle_nodes, total_gpus=v.total_gpus,
                             free_gpus=v.free_gpus, gpus_per_node=v.gpus_per_node))
    return PoolList(items=items, note="" if items else service.NO_POOL)


@storage_router.get("", response_model=StorageList, operation_id="listStorage", summary="Storage jobs may mount",
                    description="The storages the caller's accounts may mount (every one for admins): where jobs see "
                                "each, on which pools it exists, and the directory each of the caller's accounts "
                                "gets. Admins also see whether each pool can give it now (docs/storage.md).",
                    responses=problem_responses(401))
def list_storage(request: Request, principal: CurrentPrincipal,
                 session: Session = Depends(get_session, scope="function")) -> StorageList:
    catalog = getattr(request.app.state, "storage", None)
    if not catalog:
        return StorageList(items=[])
    chains = accounts.chains(session, sorted(principal.accounts))
    health = service.storage_health(catalog, request.app.state.backends, session) if principal.is_admin else {}
    items = []
    for storage in catalog.storages.values():
        mine = {a: storage.account_dir(a) for a, chain in chains.items() if storage.allows(a, chain)}
        if not (principal.is_admin or mine):
            continue
        pools = [StoragePoolOut(pool=pool, provider=p.provider, **health.get((storage.name, pool), {}))
                 for pool, p in sorted(storage.pools.items())]
        items.append(StorageOut(name=storage.name, path=storage.path, mode=storage.mode, tenancy=storage.tenancy,
                                pools=pools, directories=mine))
    return StorageList(items=sorted(items, key=lambda s: s.name))


def _admin_out(p: Pool) -> AdminPoolOut:
    return AdminPoolOut(name=p.name, kind=p.kind, state=p.state, state_by=p.state_by, weight=p.weight,
                        weight_by=p.weight_by, cost=p.cost, gpu_types=list(p.gpu_types or []),
                        configured=p.configured)


@admin_router.get("", response_model=list[AdminPoolOut], operation_id="listAdminPools",
                  summary="Every pool the gateway knows", description="Configured now or in the past, with who "
                  "set its state and weight.", responses=problem_responses(401, 403))
def list_admin_pools(session: Session = Depends(get_session, scope="function")) -> list[AdminPoolOut]:
    return [_admin_out(p) for p in service.all_pools(session)]


@admin_router.patch("/{name}", response_model=AdminPoolOut, operation_id="updatePool",
                    summary="Drain, disable, enable or re-weight a pool",
                    description="`draining`: nothing new is routed there, running jobs finish; `disabled`: nothing "
                                "new either; `active`: back in service. The change takes effect at the next dispatch "
                                "round and wins over the pools file on later start-ups.",
                    responses=problem_responses(401, 403, 404, 422))
def update_pool(name: PoolName, body: PoolPatch, request: Request, principal: Principal = Depends(require_admin),
                session: Session = Depends(get_session, scope="function")) -> AdminPoolOut:
    p = service.get(session, name)
    if p is None:
        raise NotFound(f"no pool {name!r} (GET /v1/admin/pools lists them)")
    if body.state is not None:
        p.state, p.state_by = body.state.value, principal.subject
    if body.weight is not None:
        p.weight, p.weight_by = body.weight, principal.subject
    p.updated_at = utcnow()
    session.flush()
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is not None:
        dispatcher.capacity.invalidate()  # the next round reads the new state
    return _admin_out(p)
