"""``GET /metrics``: the Prometheus text exposition format."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from gateway.kit.errors import Unauthorized
from gateway.metrics.collector import RegistryCollector

router = APIRouter(tags=["health"])


def build_registry(app) -> CollectorRegistry:
    """One registry per app (never the global one), fed by the registry collector."""
    registry = CollectorRegistry(auto_describe=False)
    dispatcher = app.state.dispatcher
    pools = (lambda: dispatcher.views()) if app.state.backends else None
    registry.register(RegistryCollector(app.state.sessionmaker, pools=pools,
                                        ttl_s=app.state.settings.metrics_ttl_s))
    return registry


@router.get("/metrics", operation_id="metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
            description="Jobs by state, pool and account; queue wait; ledger and fair share; pool capacity. "
                        "Computed from the registry at scrape time, so any gateway process answers for all. "
                        "When `ISTHMUS_METRICS_TOKEN` is set, a matching bearer token is required.",
            responses={200: {"description": "Prometheus text format 0.0.4"},
                       401: {"content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
                             "description": "A metrics token is configured and the request did not carry it"}})
def metrics(request: Request) -> Response:
    token = request.app.state.settings.metrics_token
    if token:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise Unauthorized("a bearer token matching ISTHMUS_METRICS_TOKEN is required for /metrics")
    registry = getattr(request.app.state, "metrics_registry", None)
    if registry is None:
        registry = request.app.state.metrics_registry = build_registry(request.app)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
