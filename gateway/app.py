"""The FastAPI application."""

from __future__ import annotations

import contextlib
import enum
import gc
import logging
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field
from sqlalchemy import text

from gateway import __version__
from gateway.api.accounts import router as accounts_router
from gateway.api.admin import router as admin_router
from gateway.api.audit import account_router as account_audit_router
from gateway.api.audit import admin_router as admin_audit_router
from gateway.api.flows import router as job_sets_router
from gateway.api.identity import router as identity_router
from gateway.api.jobs import events_router as job_events_router
from gateway.api.jobs import router as jobs_router
from gateway.api.metrics import check_access as check_metrics_access
from gateway.api.metrics import router as metrics_router
from gateway.api.nodes import router as nodes_router
from gateway.api.pools import admin_router as pools_admin_router
from gateway.api.pools import reservations_router, storage_router
from gateway.api.pools import router as pools_router
from gateway.api.statements import router as statements_router
from gateway.api.webhooks import account_router as webhooks_router
from gateway.api.webhooks import admin_router as admin_webhooks_router
from gateway.dispatch import Dispatcher
from gateway.identity.bodylimit import BodyLimitMiddleware
from gateway.identity.seen import MembershipSeenRecorder
from gateway.identity.setup import build_authenticator
from gateway.jobs.admission import Admission
from gateway.jobs.checkpoints import JobCredentials
from gateway.jobs.events import Hubs
from gateway.kit.db import (
    Databases,
    make_async_engine,
    make_async_sessionmaker,
    make_engine,
    make_read_sessionmaker,
    make_sessionmaker,
    transaction,
)
from gateway.kit.errors import PROBLEM_JSON, install_error_handlers
from gateway.kit.logs import RequestIdMiddleware
from gateway.kit.logs import configure as configure_logging
from gateway.kit.settings import Settings, get_settings
from gateway.kit.signals import POOL, RESERVATIONS, Listener
from gateway.kit.streams import StreamLimiter
from gateway.kit.unicode import JSONResponse
from gateway.ledger.decayed import Ledger
from gateway.pools import service as pools
from gateway.pools.config import build as build_pools
from gateway.pools.config import load as load_pools
from gateway.pools.config import load_prices, load_storage
from gateway.pools.service import reconcile_at_startup as reconcile_pools
from gateway.pools.service import storage_at_startup
from gateway.ui.apidocs import install as install_api_docs
from gateway.ui.router import install as install_ui
from gateway.webhooks.address import check_allowlist as check_webhook_allowlist

log = logging.getLogger("isthmus")

DESCRIPTION = """\
Isthmus is one REST gateway in front of a Slurm pool and a Kueue-enabled Kubernetes pool.
Jobs are gangs: all workers start together or not at all. Errors are RFC 9457
`application/problem+json`; validation errors name each bad field in `errors`.
Authenticate with an OIDC bearer token from your organisation's provider.
"""

TAGS = [
    {"name": "jobs", "description": "Submit, follow and cancel gang jobs."},
    {"name": "accounts", "description": "Your accounts: usage, remaining budget, fair share."},
    {"name": "identity", "description": "What the gateway made of your token."},
    {"name": "pools", "description": "The configured pools, their health and capacity."},
    {"name": "webhooks", "description": "Signed HTTPS callbacks for your account's job state changes."},
    {"name": "admin", "description": "Administration: accounts, quotas, credits, ledger, usage reports."},
    {"name": "health", "description": "Liveness and readiness probes (no authentication)."},
]

# Generated clients use the first entry as their default base URL; `make run` serves here.
SERVERS = [{"url": "http://127.0.0.1:8080", "description": "A local gateway (`make run`); set your own base URL"}]


class ReadyStatus(str, enum.Enum):
    OK = "ok"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


class PoolReadiness(BaseModel):
    ok: bool
    kind: str = Field(description="`slurm` or `kubernetes`.")
    reason: str = Field(description="Why it is (un)healthy, in a user's words.")


class ReadyOut(BaseModel):
    """The readiness report, sent with 200 (ready or degraded) and 503 (not ready)."""

    status: ReadyStatus = Field(description="`degraded`: the database answers but an identity provider or a pool "
                                            "is unhealthy; `unavailable` (503): the database does not answer, or no "
                                            "identity provider can validate a token.")
    database: str = Field(description="`ok` or `error: <type>`.")
    identity: dict[str, dict[str, Any]] = Field(description="Per identity provider: `ok` and its key status.")
    pools: dict[str, PoolReadiness] = Field(description="Per configured pool: its last probe.")
    pools_note: str | None = Field(default=None, description="Set when no pool is configured.")
    identity_note: str | None = Field(default=None, description="Set when no identity provider has a usable key.")


def client_friendly_openapi(spec: dict[str, Any]) -> dict[str, Any]:
    """Make the generated document say exactly what the server sends (docs/clients.md).

    - Every error response is ``Problem`` as ``application/problem+json`` only, including
      the 422 FastAPI adds on its own (it would say ``HTTPValidationError``, never sent).
    - Integers are ``int64`` and numbers ``double``: generators default to 32 bits, and
      GPU-seconds, ids and budgets do not fit in them.
    - ``additionalProperties: false`` is left out (the server still refuses unknown fields
      with a 422 naming them): openapi-generator cannot name such schemas.
    """
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for ops in spec.get("paths", {}).values():
        for op in ops.values():
            for code, resp in op.get("responses", {}).items():
                content = resp.get("content", {})
                if code[0] in "45" and (PROBLEM_JSON in content or _refs(content, "HTTPValidationError")):
                    resp["content"] = {PROBLEM_JSON: problem}
    schemas = spec.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    _walk_schemas(spec)
    return spec


def _refs(node: Any, name: str) -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == f"#/components/schemas/{name}" or any(_refs(v, name) for v in node.values())
    if isinstance(node, list):
        return any(_refs(v, name) for v in node)
    return False


def _walk_schemas(node: Any) -> None:
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "integer":
            node.setdefault("format", "int64")
        elif kind == "number":
            node.setdefault("format", "double")
        if node.get("additionalProperties") is False:
            del node["additionalProperties"]
        for value in node.values():
            _walk_schemas(value)
    elif isinstance(node, list):
        for value in node:
            _walk_schemas(value)


def create_served_app() -> FastAPI:
    """The app as ``isthmus serve`` runs it, once per worker process (uvicorn's factory)."""
    return create_app(freeze_at_start=True)


def create_app(settings: Settings | None = None, *, freeze_at_start: bool = False) -> FastAPI:
    """``freeze_at_start``: once started, move every object made so far out of the cycle
    collector's way (``gc.freeze``). A served worker's start-up leaves about 180,000 long-lived
    objects (modules, the ORM's mappings, the OpenAPI models); each full collection walked them
    all, 50-150 ms on this 2-core machine, a pause that every request in flight on that worker
    waited out: the submission p99 (issue #32, docs/benchmarks.md). Off for apps made in-process
    (tests, benchmarks' embedded apps), which are made many times in one process."""
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        configure_logging(settings.log_level, settings.log_format, settings.log_repeat_window_s)
        # (in every uvicorn worker process)
        engine = make_engine(settings.database_url, pool_size=settings.database_pool_size)
        app.state.engine = engine
        app.state.sessionmaker = make_sessionmaker(engine)
        # POST /v1/jobs runs its transaction on the event loop where the driver allows (kit/db.py).
        app.state.async_engine = make_async_engine(settings.database_url, pool_size=settings.database_pool_size)
        # Reads (lists, one job, the dashboard's pages) without BEGIN / COMMIT (kit/db.py, issue #46).
        app.state.db = Databases(sessions=app.state.sessionmaker, read_sessions=make_read_sessionmaker(engine),
                                 async_sessions=(make_async_sessionmaker(app.state.async_engine)
                                                 if app.state.async_engine is not None else None))
        # Event streams: one hub per process (and event loop) polls the events for all of them.
        app.state.event_hubs = Hubs(app.state.sessionmaker, heartbeat_s=settings.events_heartbeat_s)
        if settings.dev_mode:
            log.warning("DEV MODE: the local development issuer is trusted; do not use in production")
            _seed_dev_accounts(app, settings)
        pool_configs = load_pools(settings)
        pool_notes = reconcile_pools(app.state.sessionmaker, pool_configs)
        for note in pool_notes:
            log.info("%s", note)
        app.state.pools = {p.name: p for p in pool_configs}
        app.state.storage = load_storage(settings, pool_configs)  # docs/storage.md
        app.state.prices = load_prices(settings, pool_configs)  # statements (docs/ledger.md)
        app.state.backends = build_pools(pool_configs)
        try:
            for note in storage_at_startup(app.state.sessionmaker, app.state.storage, app.state.backends):
                log.warning("%s", note)
        except Exception:
            for backend in app.state.backends.values():
                backend.close()
            engine.dispose()
            if app.state.async_engine is not None:
                await app.state.async_engine.dispose()
            raise
        app.state.dispatcher = Dispatcher(sessions=app.state.sessionmaker, backends=app.state.backends,
                                          settings=settings.dispatch, storage=app.state.storage)
        # What admission at submit reads besides the request (jobs/admission.py), built once.
        app.state.admission = Admission(settings=settings, storage=app.state.storage, backends=app.state.backends,
                                        latest_views=app.state.dispatcher.latest_views)
        if app.state.backends and settings.dispatch_in_serve:
            app.state.dispatcher.start()
        # Pool and reservation changes made through any replica (docs/architecture.md "Replicas").
        app.state.signals = follow_signals(settings.database_url, app.state.dispatcher,
                                           dispatching=bool(app.state.backends and settings.dispatch_in_serve))
        app.state.webhooks = None
        if settings.webhooks_in_serve:
            from gateway.webhooks.worker import WebhookWorker

            app.state.webhooks = WebhookWorker(sessions=app.state.sessionmaker, settings=settings.webhooks)
            app.state.webhooks.start()
        if freeze_at_start:
            gc.collect()  # garbage of the start-up is freed, not kept forever
            gc.freeze()
        try:
            yield
        finally:
            await app.state.event_hubs.stop()
            if app.state.signals is not None:
                app.state.signals.stop()
            app.state.dispatcher.stop()
            if app.state.webhooks is not None:
                app.state.webhooks.stop()
            for backend in app.state.backends.values():
                backend.close()
            engine.dispose()
            if app.state.async_engine is not None:
                await app.state.async_engine.dispose()

    app = FastAPI(title="Isthmus", version=__version__, description=DESCRIPTION, openapi_tags=TAGS,
                  servers=SERVERS, lifespan=lifespan, docs_url=None, redoc_url=None,
                  default_response_class=JSONResponse)
    app.state.settings = settings
    app.state.ledger = Ledger.of(settings)  # fair share and usage at the one half-life (ledger/decayed.py)
    app.state.authenticator = build_authenticator(settings)  # refuses to start without an issuer
    check_metrics_access(settings)  # refuses to start with /metrics open outside dev mode
    check_webhook_allowlist(settings)  # a typo fails at start, not at the first delivery
    # Event streams and log follows, per caller and in all (gateway/kit/streams.py).
    app.state.streams = StreamLimiter(per_subject=settings.max_streams_per_subject, total=settings.stream_budget)
    # Who was seen holding which accounts: keeps webhook endpoints alive (docs/webhooks.md).
    app.state.membership_seen = MembershipSeenRecorder(lambda: app.state.sessionmaker,
                                                       write_every_s=settings.membership_seen_write_s)
    install_error_handlers(app)
    # Refuses oversized, unauthenticated or slow bodies before anything reads them.
    # Jobs' checkpoint credentials (docs/recovery.md): good for their checkpoint call only.
    app.state.job_credentials = JobCredentials(lambda: app.state.sessionmaker)
    app.add_middleware(BodyLimitMiddleware, authenticator=app.state.authenticator,
                       max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s,
                       job_credentials=app.state.job_credentials)
    # Added last, so outermost: every request, even one refused above, gets a request id
    # (logs and the X-Request-ID header).
    app.add_middleware(RequestIdMiddleware, access_log=settings.access_log)
    app.include_router(jobs_router)
    app.include_router(job_sets_router)
    app.include_router(job_events_router)
    app.include_router(accounts_router)
    app.include_router(statements_router)
    app.include_router(admin_router)
    app.include_router(admin_audit_router)
    app.include_router(account_audit_router)
    app.include_router(identity_router)
    app.include_router(pools_router)
    app.include_router(pools_admin_router)
    app.include_router(reservations_router)
    app.include_router(nodes_router)
    app.include_router(storage_router)
    app.include_router(metrics_router)
    install_api_docs(app)  # /docs and /redoc from the gateway's own assets, no CDN
    install_ui(app)  # the /ui dashboard (docs/ui.md)
    app.include_router(webhooks_router)
    app.include_router(admin_webhooks_router)

    fastapi_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = client_friendly_openapi(fastapi_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/healthz", tags=["health"], operation_id="healthz", summary="Liveness",
             responses={200: {"content": {"application/json": {"example": {"status": "ok"}}}}})
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], operation_id="readyz", summary="Readiness",
             description="Checks the database, each identity provider's keys and each pool's health. "
                         "503 when the database is unreachable or no identity provider has a key to "
                         "validate a token with (nobody can log in); 200 `degraded` when some provider or pool is "
                         "unhealthy (`pools.<name>.reason` says why).",
             responses={200: {"model": ReadyOut, "description": "Ready (or degraded)",
                              "content": {"application/json": {"example": {
                 "status": "ok", "database": "ok",
                 "identity": {"development issuer (dev mode)": {"ok": True, "keys": 1}},
                 "pools": {"slurm": {"ok": True, "kind": "slurm", "reason": "4/4 nodes idle"}}}}}},
                        503: {"model": ReadyOut, "description": "Not ready: the database is unreachable, "
                                                                "or no identity provider can validate a token"}})
    def readyz(request: Request):
        body: dict = {"status": "ok", "database": "ok"}
        try:
            with request.app.state.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            body.update(status="unavailable", database=f"error: {type(exc).__name__}")
        identity = request.app.state.authenticator.status()
        body["identity"] = identity
        body["pools"] = {name: {"ok": h.ok, "kind": h.kind, "reason": h.reason}
                         for name, h in pools.current(getattr(request.app.state, "dispatcher", None)).items()}
        if not body["pools"]:
            body["pools_note"] = "no pool is configured (ISTHMUS_BACKENDS): jobs wait in pending"
        unhealthy = [v for v in identity.values() if not v.get("ok", True)]
        # An issuer with cached keys still validates tokens while its provider is away.
        if not any(v.get("keys", 0) for v in identity.values()) and body["status"] == "ok":
            body["status"] = "unavailable"
            body["identity_note"] = "no identity provider has a usable key: no token can be validated"
        elif body["status"] == "ok" and (unhealthy or any(not p["ok"] for p in body["pools"].values())):
            body["status"] = "degraded"
        return JSONResponse(body, status_code=200 if body["status"] != "unavailable" else 503)

    return app


def follow_signals(database_url: str, dispatcher: Dispatcher, *, dispatching: bool) -> Listener | None:
    """Start listening for pool and reservation changes signalled by any process
    (gateway/kit/signals.py), or None when this process has no pool. Every process: the capacity
    snapshot its GET /v1/pools, dashboard and submit checks read is taken again. A process whose
    dispatcher runs (``dispatching``: ``serve`` with dispatch on, ``isthmus worker``) also makes
    the pool's backend reservations match the registry and starts a round. A name of None (after
    every (re)connect: signals sent meanwhile are lost) means every pool."""
    if not dispatcher.backends:
        return None

    def on_pool(_pool: str | None) -> None:
        dispatcher.capacity.invalidate()
        if dispatching:
            dispatcher.wake()

    def on_reservations(pool: str | None) -> None:
        dispatcher.capacity.invalidate()
        if not dispatching:
            return
        if pool is None:
            dispatcher.native_reservations.sync()
        elif pool in dispatcher.backends:
            dispatcher.native_reservations.sync(pools={pool: dispatcher.backends[pool]})
        dispatcher.wake()

    return Listener(database_url).on(POOL, on_pool).on(RESERVATIONS, on_reservations).start()


def _seed_dev_accounts(app: FastAPI, settings: Settings) -> None:
    from sqlalchemy.exc import IntegrityError

    from gateway.accounts.service import exists
    from gateway.admin import lifecycle
    from gateway.audit.service import Who

    names = [n.strip() for n in settings.dev_accounts.split(",") if n.strip()]
    for attempt in (1, 2):
        try:
            with transaction(app.state.sessionmaker) as session:
                for name in names:
                    if not exists(session, name):
                        lifecycle.create(session, name=name, parent_name=None, shares=1,
                                         description="dev-mode demo account", by=Who.system("dev-seed"))
            return
        except IntegrityError:
            # Another worker process of `serve --workers N` seeded them between our read and
            # our insert (a clean-clone CI run, 2026-12-03): read again, they are there now.
            if attempt == 2:
                raise
        except Exception:
            log.error("could not seed dev accounts; run `isthmus migrate` first")
            raise
