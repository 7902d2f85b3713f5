"""The /ui session: a signed cookie, HttpOnly, SameSite=Lax, Secure under TLS, path /ui,
and, once logged in, a server-side row (docs/ui.md, "Sessions").

Starlette's SessionMiddleware fixes the Secure flag at start-up; this one sets it per
request from the scheme (uvicorn's --proxy-headers makes that the client's scheme behind a
TLS-terminating proxy), and only touches requests under /ui, so API responses never carry a
cookie. The cookie is signed (itsdangerous), not encrypted. Before login it carries the
OAuth state of the login in progress; after login only a random session id (``sid``). The
access token, the CSRF token and the expiry stay in the ``ui_session`` table, found by the
id's SHA-256 (several worker processes share it), so logout ends the session everywhere:
the row is deleted and a replayed cookie finds nothing (#27, finding 9).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from base64 import b64decode, b64encode
from datetime import datetime, timedelta

import itsdangerous
from sqlalchemy import delete, select
from sqlalchemy.orm import Session
from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection

from gateway.kit.timeutil import as_utc, utcnow
from gateway.models.ui import UiSession

COOKIE = "isthmus_ui"
PREFIX = "/ui"
MAX_AGE_S = 12 * 3600  # a session ends by then even if the provider's token lives longer


def hash_id(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


def create(session: Session, *, access_token: str, subject: str, token_expires_at: datetime | None) -> str:
    """Store a logged-in session and return its id (for the cookie); expired rows are purged here."""
    now = utcnow()
    purge_expired(session, now=now)
    expires = now + timedelta(seconds=MAX_AGE_S)
    if token_expires_at is not None:
        expires = min(expires, as_utc(token_expires_at))
    sid = secrets.token_urlsafe(32)
    session.add(UiSession(id_hash=hash_id(sid), access_token=access_token, csrf=secrets.token_urlsafe(32),
                          subject=subject, created_at=now, expires_at=expires))
    session.flush()
    return sid


def get(session: Session, *, sid: str) -> UiSession | None:
    """The live session with this id; None when there is none, it was revoked, or it expired."""
    if not sid or not isinstance(sid, str):
        return None
    return session.scalar(select(UiSession).where(UiSession.id_hash == hash_id(sid),
                                                  UiSession.expires_at > utcnow()))


def revoke(session: Session, *, sid: str) -> None:
    if sid and isinstance(sid, str):
        session.execute(delete(UiSession).where(UiSession.id_hash == hash_id(sid)))


def purge_expired(session: Session, *, now: datetime) -> int:
    return session.execute(delete(UiSession).where(UiSession.expires_at <= now)).rowcount or 0


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
