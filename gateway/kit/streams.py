"""Long-lived responses (server-sent events, log follows) held to a per-subject and a total budget.

Issue #27, finding 4 (docs/security.md, 27.4). uvicorn's ``limit_concurrency``
(``ISTHMUS_MAX_CONNECTIONS``) answers 503 to every new connection once that many are open,
before the app sees the request: one user holding that many streams locked everyone out,
``/healthz`` included. Every stream route therefore takes a :class:`Permit` from the app's
:class:`StreamLimiter` before it answers:

- at most ``per_subject`` open streams per caller (``Principal.subject``): beyond, 429;
- at most ``total`` open streams in the process, below ``max_connections``: beyond, 503
  with ``Retry-After``. The connections left over are never taken by streams, so health
  probes and ordinary API calls still get in.

Counts are per process, like uvicorn's limit they protect: with ``--workers N`` a caller may
hold up to N x ``per_subject`` streams in all (docs/logs.md says why this is not global).
The permit is released when the response's ASGI call ends, whatever ended it (the stream
finished, the client went away, an error), so a closed stream frees its slot at once.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterable, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.kit.errors import GatewayError, LimitExceeded

RETRY_AFTER_S = 5


class StreamsBusy(GatewayError):
    """The process's stream budget is spent: a capacity limit, not the caller's fault."""

    status, title, slug = 503, "Too many open streams", "streams-busy"


class Permit:
    """One open stream; release() is idempotent."""

    def __init__(self, limiter: StreamLimiter, subject: str):
        self._limiter, self._subject, self._released = limiter, subject, False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limiter._release(self._subject)


class StreamLimiter:
    """Counts open streams per subject and in total, in this process (thread-safe: sync routes run in threads)."""

    def __init__(self, *, per_subject: int, total: int):
        self.per_subject, self.total = per_subject, total
        self._open: dict[str, int] = {}
        self._count = 0
        self._lock = threading.Lock()

    def acquire(self, subject: str) -> Permit:
        """A permit for one more stream of ``subject``, or the problem saying which limit is reached."""
        with self._lock:
            mine = self._open.get(subject, 0)
            if mine >= self.per_subject:
                raise LimitExceeded(
                    f"you have {mine} streams open, the limit per caller (ISTHMUS_MAX_STREAMS_PER_SUBJECT="
                    f"{self.per_subject}; event streams, /ui/events and logs?follow=true count together): "
                    "close one first", headers={"Retry-After": str(RETRY_AFTER_S)})
            if self._count >= self.total:
                raise StreamsBusy(
                    f"this gateway process has {self._count} streams open, its limit (ISTHMUS_MAX_STREAMS="
                    f"{self.total}, kept below ISTHMUS_MAX_CONNECTIONS): try again later",
                    headers={"Retry-After": str(RETRY_AFTER_S)})
            self._open[subject] = mine + 1
            self._count += 1
        return Permit(self, subject)

    def _release(self, subject: str) -> None:
        with self._lock:
            left = self._open.get(subject, 0) - 1
            if left > 0:
                self._open[subject] = left
            else:
                self._open.pop(subject, None)
            self._count = max(0, self._count - 1)

class HeldStreamingResponse(StreamingResponse):
    """A StreamingResponse that releases its permit when its ASGI call ends, however it ends."""

    def __init__(self, content: AsyncIterable[bytes], *, permit: Permit | None, status_code: int = 200,
                 headers: Mapping[str, str] | None = None, media_type: str | None = None):
        super().__init__(content, status_code=status_code, headers=headers, media_type=media_type)
        self.permit = permit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.permit is not None:
                self.permit.release()
