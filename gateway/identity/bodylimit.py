"""Request bodies: authenticate first, cap the size, and give up on slow senders.

Issue #12, finding 5 (docs/security.md). FastAPI reads and parses a JSON body before it
resolves the route's dependencies, so authentication used to run only after a body of
any size had been read into memory. This pure ASGI middleware runs before the app, for
every request that may carry a body:

1. ``Content-Length`` above ``max_body_bytes``: 413 at once, nothing read;
2. a ``/v1/`` request without a valid bearer token: 401 at once, nothing read (the
   principal is kept in the scope, so the route's dependency does not validate again);
3. the body is read here, at most ``max_body_bytes`` (a chunked body that grows past the
   cap: 413) and within ``body_timeout_s`` from the first byte asked for (a client that
   stalls or trickles: 408); a JSON body with a string that is not valid Unicode (a lone
   UTF-16 surrogate) is refused with 422 naming the field (gateway/kit/unicode.py); then
   the app gets it from memory.

Every refusal is RFC 9457 problem+json and closes the connection (the unread rest of the
body is never drained). Memory per request is therefore bounded by the cap.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from anyio import to_thread

from gateway.identity.authn import InvalidToken
from gateway.identity.dependency import JOB_CREDENTIAL_SCOPE_KEY, PRINCIPAL_SCOPE_KEY
from gateway.kit.errors import PROBLEM_JSON, TYPE_BASE
from gateway.kit.unicode import lone_surrogate_field

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
AUTHENTICATED_PREFIX = "/v1/"
# The one call a job credential is good for (gateway/jobs/checkpoints.py): the whole path.
CHECKPOINT_PATH = re.compile(r"/v1/jobs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/checkpoints")
JOB_CREDENTIAL_PREFIX = "ijt1."


class _Refusal(Exception):
    def __init__(self, status: int, title: str, slug: str, detail: str, headers: dict[str, str] | None = None,
                 errors: list[dict] | None = None):
        super().__init__(detail)
        self.status, self.title, self.slug, self.detail = status, title, slug, detail
        self.headers = headers or {}
        self.errors = errors


def _header(scope: dict[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value
    return None


class BodyLimitMiddleware:
    def __init__(self, app, *, authenticator, max_body_bytes: int, body_timeout_s: float, job_credentials=None):
        self.app = app
        self.authenticator = authenticator
        # check(token, job_id) -> attempt, raising on anything else (gateway/jobs/checkpoints.py).
        self.job_credentials = job_credentials
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            self._check_length(scope)
            if scope["path"].startswith(AUTHENTICATED_PREFIX):
                credential = await self._job_credential(scope)
                if credential is not None:
                    scope[JOB_CREDENTIAL_SCOPE_KEY] = credential
                else:
                    scope[PRINCIPAL_SCOPE_KEY] = await self._authenticate(scope)
            body = await self._read_body(receive)
            if (field := lone_surrogate_field(body)) is not None:
                raise _Refusal(422, "Invalid request", "validation-error",
                               f"{field}: not valid Unicode (a lone UTF-16 surrogate)",
                               errors=[{"field": field, "message": "not valid Unicode (a lone UTF-16 surrogate)",
                                        "type": "unicode_error"}])
        except _Refusal as refusal:
            await _send_problem(send, refusal)
            return
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _check_length(self, scope) -> None:
        raw = _header(scope, b"content-length")
        if raw is None:
            return
        try:
            length = int(raw)
        except ValueError:
            raise _Refusal(400, "Bad request", "bad-request", "Content-Length is not a number") from None
        if length > self.max_body_bytes:
            raise self._too_large()

    def _too_large(self) -> _Refusal:
        return _Refusal(413, "Request body too large", "body-too-large",
                        f"the request body exceeds this gateway's limit of {self.max_body_bytes} bytes "
                        f"(ISTHMUS_MAX_BODY_BYTES)")

    async def _job_credential(self, scope) -> tuple[str, int] | None:
        """(job id, attempt) of a job credential on the checkpoint call, else None (the token
        is then validated as any other, and a job credential there is refused as invalid)."""
        match = CHECKPOINT_PATH.fullmatch(scope["path"])
        if match is None or self.job_credentials is None:
            return None
        raw = _header(scope, b"authorization")
        scheme, _, token = (raw or b"").decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token.startswith(JOB_CREDENTIAL_PREFIX):
            return None
        try:
            attempt = await to_thread.run_sync(self.job_credentials.check, token, match.group(1))
        except Exception:  # noqa: BLE001 - any failure to check is a refusal, never a pass
            raise _Refusal(401, "Unauthorized", "unauthorized", "not a job credential of this job",
                           {"WWW-Authenticate": 'Bearer error="invalid_token"'}) from None
        return match.group(1), attempt

    async def _authenticate(self, scope):
        raw = _header(scope, b"authorization")
        scheme, _, token = (raw or b"").decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _Refusal(401, "Unauthorized", "unauthorized", "missing bearer token",
                           {"WWW-Authenticate": "Bearer"})
        principal = self.authenticator.cached(token)
        if principal is not None:
            return principal
        try:
            # Key look-ups may fetch a provider's JWKS: keep blocking I/O off the event loop.
            return await to_thread.run_sync(self.authenticator.authenticate, token)
        except InvalidToken as exc:
            reason = str(exc).replace('"', "'")
            raise _Refusal(401, "Unauthorized", "unauthorized", str(exc),
                           {"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{reason}"'}) \
                from None

    async def _read_body(self, receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.body_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), remaining)
            except TimeoutError:
                raise _Refusal(408, "Request timeout", "request-timeout",
                               f"the request body did not arrive within {self.body_timeout_s:g} s "
                               f"(ISTHMUS_BODY_TIMEOUT_S)") from None
            if message["type"] == "http.disconnect":
                raise _Refusal(400, "Bad request", "bad-request", "the client went away before sending its body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _send_problem(send, refusal: _Refusal) -> None:
    problem = {"type": TYPE_BASE + refusal.slug, "title": refusal.title, "status": refusal.status,
               "detail": refusal.detail}
    if refusal.errors:
        problem["errors"] = refusal.errors
    payload = json.dumps(problem).encode()
    headers = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(payload)).encode()),
               (b"connection", b"close")]
    headers += [(k.lower().encode(), v.encode("latin-1")) for k, v in refusal.headers.items()]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
