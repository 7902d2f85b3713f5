"""The dashboard's pages and error pages as HTML (templates/), one way for every /ui answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.identity.principal import Principal
from gateway.kit.errors import GatewayError
from gateway.ui.auth import csrf_token, principal_of

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=str)


def render(request: Request, template: str, context: dict[str, Any], *, principal: Principal | None = None,
           status: int = 200) -> HTMLResponse:
    ctx = {"principal": principal, "csrf": csrf_token(request) if principal else "",
           "nav": request.url.path, **context}
    return templates.TemplateResponse(request, template, ctx, status_code=status,
                                      headers={"Cache-Control": "no-store"})


# ------------------------------------------------------------------ pages


def under_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def html_error_pages(app: FastAPI) -> None:
    """Errors under /ui as HTML pages in the dashboard's style; everywhere else problem+json.

    Each API handler (gateway/kit/errors.py) still decides the status, title, detail and
    headers (and logs a 500): under /ui its problem is rendered as a page instead of sent as
    JSON, so the two can never disagree. Needs the API's handlers installed first.
    """
    for exc_class in (GatewayError, RequestValidationError, StarletteHTTPException, Exception):
        if exc_class not in app.exception_handlers:
            raise RuntimeError(f"install the API's error handlers before the dashboard's ({exc_class.__name__})")
    # Every handler the API installed, the database outage's 503 among them (kit/errors.py).
    for exc_class, api_handler in list(app.exception_handlers.items()):
        app.add_exception_handler(exc_class, _page_or_problem(api_handler))


def _page_or_problem(api_handler):
    async def handler(request: Request, exc: Exception) -> Response:
        problem = await api_handler(request, exc)
        if not under_ui(request.url.path):
            return problem
        body = json.loads(problem.body)
        headers = {k: v for k, v in problem.headers.items()
                   if k.lower() not in ("content-type", "content-length")}
        return error_page(request, status=problem.status_code, title=body.get("title") or "Error",
                          detail=body.get("detail") or "", errors=body.get("errors") or [], headers=headers)
    return handler


def error_page(request: Request, *, status: int, title: str, detail: str, errors: list[dict] | None = None,
               headers: dict[str, str] | None = None) -> HTMLResponse:
    """The dashboard's page for a failed request: the problem the API would send, as HTML."""
    principal = None
    if "session" in request.scope:  # a 500 is rendered outside the session middleware
        try:
            principal = principal_of(request)
        except Exception:  # noqa: BLE001 - the error page must render whoever asks
            principal = None
    ctx = {"principal": principal, "csrf": csrf_token(request) if principal else "", "nav": "",
           "status": status, "title": title, "detail": "" if detail == title else detail, "errors": errors or []}
    return templates.TemplateResponse(request, "error.html", ctx, status_code=status,
                                      headers={**(headers or {}), "Cache-Control": "no-store"})
