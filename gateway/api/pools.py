"""HTTP only: /v1/pools (any user) and /v1/admin/pools (admins)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.accounts.schemas import POOL_NAME_PATTERN
from gateway.domain.windows import (
    PlannedHold,
    PlannedWindow,
    hold_words,
    shortfall,
    words,
)
from gateway.identity.dependency import CurrentPrincipal, require_admin
from gateway.identity.principal import Principal
from gateway.kit.db import get_session
from gateway.kit.errors import NotFound, problem_responses
from gateway.kit.timeutil import utcnow
from gateway.models.pools import Pool
from gateway.pools import nodehealth, reservations, service, windows
from gateway.pools.schemas import (
    AdminPoolOut,
    DomainOut,
    PoolList,
    PoolOut,
    PoolPatch,
    ReservationIn,
    ReservationOut,
    StorageList,
    StorageOut,
    StoragePoolOut,
    WindowIn,
    WindowOut,
)

router = APIRouter(prefix="/v1/pools", tags=["pools"])
admin_router = APIRouter(prefix="/v1/admin/pools", tags=["admin"], dependencies=[Depends(require_admin)])
reservations_router = APIRouter(prefix="/v1/admin/reservations", tags=["admin"], dependencies=[Depends(require_admin)])
storage_router = APIRouter(prefix="/v1/storage", tags=["pools"])

PoolName = Annotated[str, Path(pattern=POOL_NAME_PATTERN, max_length=63, description="The pool's name.")]


@router.get("", response_model=PoolList, operation_id="listPools", summary="List pools and their health",
            description="Each configured pool: its kind, state, GPU types, weight and cost, whether it can take "
                        "jobs now and why, its queue depth and its capacity at the last probe (at most "
                        "`ISTHMUS_CAPACITY_TTL_S` old).",
            responses=problem_responses(401))
def list_pools(request: Request, principal: CurrentPrincipal,
               session: Session = Depends(get_session, scope="function")) -> PoolList:
    dispatcher = getattr(request.app.state, "dispatcher", None)
    health = service.current(dispatcher)
    now = utcnow()
    shown: dict[str, list[WindowOut]] = {}
    if health:
        for w in windows.shown(session, {name: h.view for name, h in health.items()}, now=now):
            shown.setdefault(w.pool, []).append(_window_out(w, now, health[w.pool].view.total_nodes))
    quarantined = nodehealth.quarantined_now(session)
    items = []
    for name, h in health.items():
        v = h.view
        items.append(PoolOut(name=name, kind=v.kind, state=v.state, healthy=h.ok, reason=h.reason,
                             gpu_types=sorted(v.gpu_types), weight=v.weight, cost=v.cost, queue_depth=v.queue_depth,
                             total_nodes=v.total_nodes, idle_nodes=v.idle_nodes, total_gpus=v.total_gpus,
                             free_gpus=v.free_gpus, gpus_per_node=v.gpus_per_node, windows=shown.get(name, []),
                             topology=[DomainOut(level=d.level, name=d.name, nodes=list(d.nodes),
                                                 idle_nodes=d.idle_nodes)
                                       for p in (v.capacity.pools if v.capacity else ()) for d in p.topology],
                             quarantined_nodes=quarantined.get(name, [])))
    return PoolList(items=items, note="" if items else service.NO_POOL)


def _window_out(w: PlannedWindow, now, pool_nodes: int = 0) -> WindowOut:
    return WindowOut(id=w.name, pool=w.pool, source=w.source, start=w.start,
                     end=None if windows.is_open_ended(w) else w.end, maintenance=w.maintenance,
                     nodes=list(w.nodes), reason=w.reason, active=w.start <= now, words=words(w, pool_nodes))


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
    p = service.update(session, name=name, state=body.state.value if body.state is not None else None,
                       weight=body.weight, by=principal.who, now=utcnow())
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is not None:
        dispatcher.capacity.invalidate()  # the next round reads the new state
    return _admin_out(p)


WindowId = Annotated[str, Path(pattern=r"^[0-9a-f-]{36}$", description="The window's id (a gateway window).")]


def _views(request: Request) -> dict:
    dispatcher = getattr(request.app.state, "dispatcher", None)
    return {name: h.view for name, h in service.current(dispatcher).items()}


@admin_router.get("/{name}/windows", response_model=list[WindowOut], operation_id="listPoolWindows",
                  summary="A pool's maintenance windows",
                  description="Every window on the pool that has not ended, by start: the ones admins made here "
                              "and the backend's own (a Slurm reservation that takes nodes of the pool, read at "
                              "the last capacity probe). docs/planning.md.",
                  responses=problem_responses(401, 403, 404))
def list_windows(name: PoolName, request: Request,
                 session: Session = Depends(get_session, scope="function")) -> list[WindowOut]:
    views = _views(request)  # before the session's transaction: a capacity refresh has its own (SQLite: one writer)
    if service.get(session, name) is None:
        raise NotFound(f"no pool {name!r} (GET /v1/admin/pools lists them)")
    now = utcnow()
    nodes = views[name].total_nodes if name in views else 0
    return [_window_out(w, now, nodes) for w in windows.shown(session, views, now=now, pool=name)]


@admin_router.post("/{name}/windows", status_code=201, response_model=WindowOut, operation_id="createPoolWindow",
                   summary="Set a maintenance window on a pool",
                   description="From `start` to `end` the pool (or only `nodes` of it) runs nothing of the "
                               "gateway's: no gang whose time limit would cross the window starts on the capacity it "
                               "takes, start estimates move behind it, and shorter jobs still use the time before it. "
                               "Jobs already running are not stopped. Takes effect at the next dispatch round.",
                   responses=problem_responses(401, 403, 404, 422))
def create_window(name: PoolName, body: WindowIn, principal: Principal = Depends(require_admin),
                  session: Session = Depends(get_session, scope="function")) -> WindowOut:
    now = utcnow()
    row = windows.create(session, name, starts_at=body.start, ends_at=body.end, reason=body.reason,
                         nodes=body.nodes, by=principal.who, now=now)
    return _window_out(windows.planned_of(row.id, row.pool, row.starts_at, row.ends_at, row.nodes, row.reason), now)


@admin_router.delete("/{name}/windows/{window_id}", status_code=204, operation_id="deletePoolWindow",
                     summary="Delete a maintenance window",
                     description="Only a window made through the gateway; a backend's own reservation is deleted "
                                 "in the backend (e.g. `scontrol delete ReservationName=...`).",
                     responses=problem_responses(401, 403, 404))
def delete_window(name: PoolName, window_id: WindowId, principal: Principal = Depends(require_admin),
                  session: Session = Depends(get_session, scope="function")) -> Response:
    windows.remove(session, name, window_id, by=principal.who)
    return Response(status_code=204)


def _reservation_out(h: PlannedHold, views: dict, now) -> ReservationOut:
    return ReservationOut(id=h.id, account=h.account, pool=h.pool, gpus=h.gpus, nodes=h.nodes, start=h.start,
                          end=h.end, reason=h.reason, active=h.start <= now, shortfall=shortfall(h, views.get(h.pool)),
                          words=hold_words(h), created_by=h.by, native=h.native or None, native_note=h.native_note)


@reservations_router.get("", response_model=list[ReservationOut], operation_id="listReservations",
                         summary="Advance reservations",
                         description="Every advance reservation that has not ended, by start, each with whether its "
                                     "pool can honour it in full now (`shortfall`). docs/planning.md.",
                         responses=problem_responses(401, 403))
def list_reservations(request: Request,
                      session: Session = Depends(get_session, scope="function")) -> list[ReservationOut]:
    views = _views(request)  # before the session's transaction (SQLite: one writer)
    now = utcnow()
    return [_reservation_out(h, views, now) for h in reservations.planned(session, now=now)]


@reservations_router.post("", status_code=201, response_model=ReservationOut, operation_id="createReservation",
                          summary="Hold GPUs or nodes of a pool for an account",
                          description="From `start` to `end`, `gpus` or `nodes` of `pool` (or of the pool the "
                                      "gateway picks for `gpu_type`) are held for `account`: its gangs use them first "
                                      "(each wholly inside, ending by `end`; its quotas still apply), nobody else's "
                                      "start there, and others' start estimates move behind it. The gateway holds it "
                                      "in its own planner on every kind of pool (docs/planning.md).",
                          responses=problem_responses(401, 403, 404, 422))
def create_reservation(body: ReservationIn, request: Request, principal: Principal = Depends(require_admin),
                       session: Session = Depends(get_session, scope="function")) -> ReservationOut:
    views = _views(request)
    now = utcnow()
    # Commits before the answer: the backend's own reservation is made from the committed row.
    row = reservations.create_synced(session, views, sync=_native_sync(request),
                                     account=body.account,
                                     pool=body.pool, gpu_type=body.gpu_type, gpus=body.gpus, nodes=body.nodes,
                                     starts_at=body.start, ends_at=body.end, reason=body.reason,
                                     by=principal.who, now=now)
    return _reservation_out(reservations.planned_of(row), views, now)


def _native_sync(request: Request) -> Callable[[str], None] | None:
    """What makes the backend's own reservations of a pool match the registry now: this
    process's dispatcher, where it runs one (else None: the worker's next sync, within 15 s)."""
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is None:
        return None

    def sync(pool: str) -> None:
        backend = dispatcher.backends.get(pool)
        if backend is not None:
            dispatcher.native_reservations.sync(pools={pool: backend})

    return sync


@reservations_router.delete("/{reservation_id}", status_code=204, operation_id="deleteReservation",
                            summary="Delete an advance reservation",
                            description="Its capacity is open to everyone from the next dispatch round; jobs "
                                        "running in it go on.", responses=problem_responses(401, 403, 404))
def delete_reservation(reservation_id: WindowId, request: Request, principal: Principal = Depends(require_admin),
                       session: Session = Depends(get_session, scope="function")) -> Response:
    reservations.remove_synced(session, reservation_id,  # its backend one goes too
                               sync=_native_sync(request), by=principal.who)
    return Response(status_code=204)
