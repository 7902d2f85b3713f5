"""Structured logs: one JSON object per line, with the request id and the job id.

``ISTHMUS_LOG_FORMAT=json`` (the default) or ``text``. Every line carries ``ts``, ``level``,
``logger`` and ``msg``; inside an HTTP request also ``request_id`` (the caller's
``X-Request-ID`` when it is a plain token, else a new one, echoed in the response), and
inside the dispatcher's and reconciler's work on a job also ``job_id``. Fields passed as
``extra=`` are added as they are. No token, header or request body is ever logged.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("isthmus_request_id", default=None)
JOB_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("isthmus_job_id", default=None)

_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName",
                                                                          "color_message"}

F = TypeVar("F", bound=Callable[..., Any])


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage(),
        }
        for key, var in (("request_id", REQUEST_ID), ("job_id", JOB_ID)):
            value = getattr(record, key, None) or var.get()
            if value:
                out[key] = value
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out and not key.startswith("_"):
                out[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class _ContextText(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{k}={v.get()}" for k, v in (("request_id", REQUEST_ID), ("job_id", JOB_ID)) if v.get())
        return f"{line} [{ids}]" if ids else line


class RepeatFilter(logging.Filter):
    """Warnings and errors that repeat: at most one per window, the next one counting the rest.

    With its API server unreachable, the Kubernetes client logged about three retries a
    second without end (issue #45): a log that floods hides what else happens and fills the
    disk. A record of level WARNING or above whose logger, level and message template were
    logged less than ``window_s`` ago is not logged; the first one after the window carries
    ``suppressed`` (how many were not) and says so in its message. Lower levels pass as they are.
    """

    MAX_KEYS = 1000

    def __init__(self, window_s: float):
        super().__init__()
        self.window_s = window_s
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or self.window_s <= 0:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        with self._lock:
            since, suppressed = self._seen.get(key, (None, 0))
            if since is not None and now - since < self.window_s:
                self._seen[key] = (since, suppressed + 1)
                return False
            if len(self._seen) >= self.MAX_KEYS:
                self._seen.clear()
            self._seen[key] = (now, 0)
        if suppressed:
            record.suppressed = suppressed
            record.msg = f"{record.msg} ({suppressed} more like this not logged in the last {self.window_s:g} s)"
        return True


def configure(level: str = "info", fmt: str = "json", repeat_window_s: float = 60.0) -> None:
    """Route the root, uvicorn and isthmus loggers to stderr in the chosen format. Idempotent."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RepeatFilter(repeat_window_s))
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         _ContextText("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler._isthmus = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if not getattr(h, "_isthmus", False)]
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers = []
        # uvicorn's own access line lacks the request id; RequestIdMiddleware writes ours.
        lg.propagate = name != "uvicorn.access"


def with_job_id(fn: F) -> F:
    """Methods whose first argument after ``self`` is a job id log with that ``job_id``."""

    @functools.wraps(fn)
    def wrapper(self, job_id, *args, **kwargs):
        token = JOB_ID.set(job_id)
        try:
            return fn(self, job_id, *args, **kwargs)
        finally:
            JOB_ID.reset(token)

    return wrapper  # type: ignore[return-value]


class RequestIdMiddleware:
    """Pure ASGI: a request id for every HTTP request, in the logs and the response header,
    and one access line per request (method, path without the query, status, duration)."""

    def __init__(self, app, *, access_log: bool = True):
        self.app = app
        self.access_log = access_log
        self.log = logging.getLogger("isthmus.access")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"x-request-id"), "")
        rid = given if _REQUEST_ID_RE.fullmatch(given) else uuid.uuid4().hex
        token = REQUEST_ID.set(rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log:
                self.log.info("%s %s %d", scope.get("method", ""), scope.get("path", ""), status,
                              extra={"method": scope.get("method", ""), "path": scope.get("path", ""),
                                     "status": status,
                                     "duration_ms": round((time.perf_counter() - started) * 1000, 2)})
            REQUEST_ID.reset(token)
