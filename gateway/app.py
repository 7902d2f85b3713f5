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
from gateway.identity.setup import build_authenticator
from gateway.jobs.router import router as jobs_router
from gateway.kit.db import make_engine, make_sessionmaker, transaction
from gateway.kit.errors import install_error_handlers
from gateway.kit.limits import BodyLimitMiddleware
from gateway.kit.settings import Settings, get_settings

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
    # Outermost: refuses oversized, unauthenticated or slow bodies before anything reads them.
    app.add_middleware(BodyLimitMiddleware, authenticator=app.state.authenticator,
                       max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s)
    app.include_router(jobs_router)
    app.include_router(accounts_router)
    app.include_router(admin_router)

    @app.get("/healthz", tags=["health"], operation_id="healthz", summary="Liveness",
             responses={200: {"content": {"application/json": {"example": {"status": "ok"}}}}})
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], operation_id="readyz", summary="Readiness",
             description="Checks the database and reports each identity provider's key status. "
                         "503 when the database is unreachable.",
             responses={200: {"content": {"application/json": {"example": {"status": "ok", "database": "ok"}}}},
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
        if body["status"] == "ok" and any(not v.get("ok", True) for v in identity.values()):
            body["status"] = "degraded"
        return JSONResponse(body, status_code=200 if body["database"] == "ok" else 503)

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
