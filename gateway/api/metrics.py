"""``GET /metrics``: the Prometheus text exposition format."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from gateway.identity.errors import ConfigurationError
from gateway.kit.errors import NotFound, Unauthorized
from gateway.metrics.collector import RegistryCollector

router = APIRouter(tags=["health"])


def check_access(settings) -> None:
    """Refuse to start with /metrics open to anyone by default (docs/operations.md).

    Its series name every account and its activity and fair share: outside dev mode a
    scraper's token is required unless the operator turned /metrics off or opened it on
    purpose (ISTHMUS_METRICS_ACCESS).
    """
    if settings.metrics_access == "open" and settings.metrics_token:
        raise ConfigurationError("ISTHMUS_METRICS_ACCESS=open and ISTHMUS_METRICS_TOKEN are both set: "
                                 "unset one (docs/operations.md)")
    if settings.metrics_access == "token" and not settings.metrics_token and not settings.dev_mode:
        raise ConfigurationError("/metrics needs a credential outside dev mode: set ISTHMUS_METRICS_TOKEN "
                                 "(scrapers send it as a bearer token), or ISTHMUS_METRICS_ACCESS=off, or "
                                 "ISTHMUS_METRICS_ACCESS=open to serve it to anyone who can reach it "
                                 "(docs/operations.md)")


def build_registry(app) -> CollectorRegistry:
    """One registry per app (never the global one), fed by the registry collector."""
    registry = CollectorRegistry(auto_describe=False)
    dispatcher = app.state.dispatcher
    pools = (lambda: dispatcher.views()) if app.state.backends else None
    registry.register(RegistryCollector(app.state.sessionmaker, pools=pools,
                                        ledger=app.state.ledger,
                                        ttl_s=app.state.settings.metrics_ttl_s))
    return registry


@router.get("/metrics", operation_id="metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
            description="Jobs by state, pool and account; queue wait; ledger and fair share; pool capacity. "
                        "Computed from the registry at scrape time, so any gateway process answers for all. "
                        "A bearer token matching `ISTHMUS_METRICS_TOKEN` is required when one is set (outside dev "
                        "mode the gateway does not start without one unless `ISTHMUS_METRICS_ACCESS` is `open` "
                        "or `off`; `off`: 404).",
            responses={200: {"description": "Prometheus text format 0.0.4"},
                       401: {"content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
                             "description": "A metrics token is configured and the request did not carry it"},
                       404: {"content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
                             "description": "/metrics is turned off (`ISTHMUS_METRICS_ACCESS=off`)"}})
def metrics(request: Request) -> Response:
    settings = request.app.state.settings
    if settings.metrics_access == "off":
        raise NotFound("/metrics is turned off on this gateway (ISTHMUS_METRICS_ACCESS=off)")
    token = settings.metrics_token if settings.metrics_access == "token" else ""
    if token:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise Unauthorized("a bearer token matching ISTHMUS_METRICS_TOKEN is required for /metrics")
    registry = getattr(request.app.state, "metrics_registry", None)
    if registry is None:
        registry = request.app.state.metrics_registry = build_registry(request.app)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
