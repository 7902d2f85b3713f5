"""The FastAPI application."""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from gateway import __version__
from gateway.accounts.router import router as accounts_router
from gateway.admin.router import router as admin_router
from gateway.dispatch.backends import build_backends
from gateway.dispatch.service import Dispatcher
from gateway.identity.router import router as identity_router
from gateway.identity.setup import build_authenticator
from gateway.jobs.router import router as jobs_router
from gateway.kit.db import make_engine, make_sessionmaker, transaction
from gateway.kit.errors import install_error_handlers
from gateway.kit.settings import Settings, get_settings
from gateway.pools import service as pools
from gateway.pools.router import router as pools_router

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
    {"name": "admin", "description": "Administration: accounts, quotas, credits, ledger, usage reports."},
    {"name": "health", "description": "Liveness and readiness probes (no authentication)."},
]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = make_engine(settings.database_url, pool_size=settings.database_pool_size)
        app.state.engine = engine
        app.state.sessionmaker = make_sessionmaker(engine)
        if settings.dev_mode:
            log.warning("DEV MODE: the local development issuer is trusted; do not use in production")
            _seed_dev_accounts(app, settings)
        app.state.backends = build_backends(settings.backends)
        app.state.dispatcher = Dispatcher(sessions=app.state.sessionmaker, backends=app.state.backends,
                                          settings=settings)
        if app.state.backends and settings.dispatch_in_serve:
            app.state.dispatcher.start()
        try:
            yield
        finally:
            app.state.dispatcher.stop()
            for backend in app.state.backends.values():
                backend.close()
            engine.dispose()

    app = FastAPI(title="Isthmus", version=__version__, description=DESCRIPTION, openapi_tags=TAGS,
                  lifespan=lifespan)
    app.state.settings = settings
    app.state.authenticator = build_authenticator(settings)  # refuses to start without an issuer
    install_error_handlers(app)
    app.include_router(jobs_router)
    app.include_router(accounts_router)
    app.include_router(admin_router)
    app.include_router(identity_router)
    app.include_router(pools_router)

    @app.get("/healthz", tags=["health"], operation_id="healthz", summary="Liveness",
             responses={200: {"content": {"application/json": {"example": {"status": "ok"}}}}})
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], operation_id="readyz", summary="Readiness",
             description="Checks the database, each identity provider's keys and each pool's health. "
                         "503 when the database is unreachable or no identity provider has a key to "
                         "validate a token with (nobody can log in); 200 `degraded` when some provider or pool is "
                         "unhealthy (`pools.<name>.reason` says why).",
             responses={200: {"content": {"application/json": {"example": {
                 "status": "ok", "database": "ok",
                 "identity": {"development issuer (dev mode)": {"ok": True, "keys": 1}},
                 "pools": {"slurm": {"ok": True, "kind": "slurm", "reason": "4/4 nodes idle"}}}}}},
                        503: {"description": "Not ready"}})
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


def _seed_dev_accounts(app: FastAPI, settings: Settings) -> None:
    from gateway.accounts.models import Account

    names = [n.strip() for n in settings.dev_accounts.split(",") if n.strip()]
    try:
        with transaction(app.state.sessionmaker) as session:
            for name in names:
                if session.get(Account, name) is None:
                    session.add(Account(name=name, shares=1, description="dev-mode demo account"))
    except Exception:  # noqa: BLE001 - schema may not be migrated yet; say so clearly
        log.error("could not seed dev accounts; run `isthmus migrate` first")
        raise
