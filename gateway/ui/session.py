"""The /ui session: a signed cookie, HttpOnly, SameSite=Lax, Secure under TLS, path /ui,
and, once logged in, a server-side row (docs/ui.md, "Sessions").

Starlette's SessionMiddleware fixes the Secure flag at start-up; this one sets it per
request from the scheme (uvicorn's --proxy-headers makes that the client's scheme behind a
TLS-terminating proxy), and only touches requests under /ui, so API responses never carry a
cookie. The cookie is signed (itsdangerous), not encrypted. Before login it carries the
OAuth state of the login in progress; after login only a random session id (``sid``). The
access token, the CSRF token and the expiry stay in the ``ui_session`` table, written and
read only through gateway/identity/ui_sessions.py (several worker processes share it), so
logout ends the session everywhere: the row is deleted and a replayed cookie finds nothing
(#27, finding 9).
"""

from __future__ import annotations

import json
from base64 import b64decode, b64encode

import itsdangerous
from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection

from gateway.identity.ui_sessions import MAX_AGE_S

COOKIE = "isthmus_ui"
PREFIX = "/ui"


class UiSessionMiddleware:
    def __init__(self, app, *, secret: str, max_age_s: int = MAX_AGE_S):
        self.app = app
        self.signer = itsdangerous.TimestampSigner(secret, salt="isthmus-ui-session")
        self.max_age_s = max_age_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not (scope["path"] == PREFIX or scope["path"].startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        initial = False
        raw = conn.cookies.get(COOKIE)
        scope["session"] = {}
        if raw:
            try:
                scope["session"] = json.loads(b64decode(self.signer.unsign(raw.encode(), max_age=self.max_age_s)))
                initial = True
            except (itsdangerous.BadSignature, ValueError):
                scope["session"] = {}
        secure = "; secure" if scope.get("scheme") == "https" else ""

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if scope["session"]:
                    data = self.signer.sign(b64encode(json.dumps(scope["session"]).encode())).decode()
                    headers.append("Set-Cookie", f"{COOKIE}={data}; path={PREFIX}; Max-Age={self.max_age_s}; "
                                                 f"httponly; samesite=lax{secure}")
                elif initial:
                    headers.append("Set-Cookie", f"{COOKIE}=null; path={PREFIX}; "
                                                 f"expires=Thu, 01 Jan 1970 00:00:00 GMT; httponly; samesite=lax{secure}")
            await send(message)

        await self.app(scope, receive, send_wrapper)
