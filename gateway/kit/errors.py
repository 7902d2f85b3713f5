"""One error hierarchy, rendered as RFC 9457 ``application/problem+json``."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.kit.db import database_unavailable

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://isthmus.dev/problems/"


class FieldError(BaseModel):
    field: str = Field(description="Dotted path of the offending field, e.g. `body.workers`.")
    message: str
    type: str = Field(description="Machine-readable reason, e.g. `greater_than_equal`.")


class Problem(BaseModel):
    """RFC 9457 problem details.

    Every field but ``errors`` is always sent, so generated clients get plain (non-null)
    strings; ``errors`` is present on validation errors only.
    """

    type: str = Field(examples=[TYPE_BASE + "validation-error"])
    title: str
    status: int
    detail: str = Field(description="Human-readable explanation; the title when there is nothing to add.")
    instance: str = Field(description="Path of the request that failed.")
    errors: list[FieldError] | SkipJsonSchema[None] = Field(
        default=None, description="Validation errors only: one entry per bad field.")


class GatewayError(Exception):
    status: int = 400
    title: str = "Bad request"
    slug: str = "bad-request"

    def __init__(self, detail: str | None = None, *, errors: list[FieldError] | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(detail or self.title)
        self.detail = detail
        self.errors = errors
        self.headers = headers


class Invalid(GatewayError):
    status, title, slug = 422, "Invalid request", "validation-error"

    def __init__(self, field: str, message: str, *, type: str = "value_error"):
        super().__init__(f"{field}: {message}", errors=[FieldError(field=field, message=message, type=type)])


class NotFound(GatewayError):
    status, title, slug = 404, "Not found", "not-found"


class Unauthorized(GatewayError):
    status, title, slug = 401, "Unauthorized", "unauthorized"

    def __init__(self, detail: str = "missing or invalid bearer token", *, error: str = "invalid_token"):
        # Never echo the token; the reason is short and fixed by the validator.
        safe = detail.replace('"', "'")
        hdr = f'Bearer error="{error}", error_description="{safe}"' if error else "Bearer"
        super().__init__(detail, headers={"WWW-Authenticate": hdr})


class Forbidden(GatewayError):
    status, title, slug = 403, "Forbidden", "forbidden"


class Conflict(GatewayError):
    status, title, slug = 409, "Conflict", "conflict"


class QuotaExceeded(GatewayError):
    status, title, slug = 409, "Quota exceeded", "quota-exceeded"


class LimitExceeded(GatewayError):
    """A per-user or per-account cap at submit (pending jobs, idempotency keys); the detail names it."""

    status, title, slug = 429, "Limit exceeded", "limit-exceeded"


class BackendUnavailable(GatewayError):
    status, title, slug = 503, "Backend unavailable", "backend-unavailable"


# Seconds a client waits before retrying a request the database could not serve: a Postgres
# restart or failover takes a few (docs/operations.md, "A database outage").
DATABASE_RETRY_AFTER_S = 5


class DatabaseUnavailable(GatewayError):
    """The database cannot be reached now: retry after ``Retry-After`` seconds. Never names the
    server, its address or the driver's message (a connection string could be in it)."""

    status, title, slug = 503, "Database unavailable", "database-unavailable"

    def __init__(self) -> None:
        super().__init__(f"the database is unavailable; retry in {DATABASE_RETRY_AFTER_S} seconds (a submission "
                         "retried with the same Idempotency-Key is recorded once)",
                         headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})


class ProblemResponse(JSONResponse):
    """problem+json as pure ASCII (non-ASCII escaped): the media type has no charset parameter,
    and a client that guesses one (requests' chardet fallback) must still read it right, e.g.
    a field name with a C1 control character followed by an escaped quote."""

    media_type = PROBLEM_JSON

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def problem_response(status: int, title: str, *, slug: str | None = None, detail: str | None = None,
                     instance: str | None = None, errors: list[FieldError] | None = None,
                     headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {
        "type": TYPE_BASE + slug if slug else "about:blank",
        "title": title,
        "status": status,
        # Always a string: clients type it as one (RFC 9457 allows it to repeat the title).
        "detail": detail or title,
        "instance": instance or "",
    }
    if errors:
        body["errors"] = [e.model_dump() for e in errors]
    return ProblemResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _field_path(loc: tuple[Any, ...]) -> str:
    # Drop pydantic's union/function tags so users see `body.memory_per_worker`.
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
    return ".".join(parts)


def _clean_msg(msg: str) -> str:
    return msg.removeprefix("Value error, ")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError):
        return _problem_of(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = [FieldError(field=_field_path(tuple(e["loc"])), message=_clean_msg(e["msg"]), type=e["type"])
                  for e in exc.errors()]
        fields = ", ".join(dict.fromkeys(e.field for e in errors))
        return problem_response(422, "Invalid request", slug="validation-error",
                                detail=f"invalid fields: {fields}", instance=request.url.path, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return problem_response(exc.status_code, str(exc.detail), detail=None,
                                instance=request.url.path, headers=getattr(exc, "headers", None))

    async def _database_error(request: Request, exc: Exception):
        if not database_unavailable(exc):
            raise exc  # not an outage: the catch-all below answers it, as before
        return _outage(request, exc)

    # The database's errors as the routes raise them (SQLAlchemy's, and psycopg's bare from
    # CompiledRead): an outage is a 503; anything else goes on to the catch-all's 500.
    for db_error in _database_errors():
        app.add_exception_handler(db_error, _database_error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # pragma: no cover - safety net
        if database_unavailable(exc):  # raised outside the routes (a middleware's read)
            return _outage(request, exc)
        logging.getLogger("isthmus").exception("unhandled error on %s", request.url.path)
        return problem_response(500, "Internal server error", slug="internal",
                                detail="an unexpected error occurred; it has been logged",
                                instance=request.url.path)


def _problem_of(request: Request, exc: GatewayError) -> JSONResponse:
    return problem_response(exc.status, exc.title, slug=exc.slug, detail=exc.detail,
                            instance=request.url.path, errors=exc.errors, headers=exc.headers)


def _outage(request: Request, exc: Exception) -> JSONResponse:
    logging.getLogger("isthmus").warning("database unavailable on %s: %s", request.url.path, type(exc).__name__)
    return _problem_of(request, DatabaseUnavailable())


def _database_errors() -> tuple[type[Exception], ...]:
    from sqlalchemy import exc as sa_exc

    found: list[type[Exception]] = [sa_exc.DBAPIError, sa_exc.TimeoutError]
    try:
        import psycopg

        found.append(psycopg.Error)
    except ImportError:  # pragma: no cover - SQLite-only installs
        pass
    return tuple(found)


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the given error codes, and always 503: every route
    that answers a problem reads the database, and a database outage answers 503 with
    ``Retry-After`` (``DatabaseUnavailable``; issue #47)."""
    if 503 not in codes:
        codes = (*codes, 503)
    descriptions = {
        400: "Bad request", 401: "Missing or invalid bearer token", 403: "Not allowed for this caller",
        404: "Not found (or not visible to this caller)", 409: "Conflict with the current state",
        413: "Request body too large", 422: "Invalid input; `errors` names each bad field",
        429: "A cap is reached (pending jobs, idempotency keys, open streams); `detail` names it",
        503: "A dependency is unavailable (the database, a pool, the stream budget): retry, after "
             "`Retry-After` seconds when it is given",
    }
    retry_after = {"Retry-After": {"description": "Seconds to wait before retrying (a database outage: "
                                                  f"{DATABASE_RETRY_AFTER_S})",
                                   "schema": {"type": "integer", "format": "int64"}}}
    return {c: {"model": Problem, "description": descriptions.get(c, "Error"),
                "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
                **({"headers": retry_after} if c == 503 else {})}
            for c in codes}
