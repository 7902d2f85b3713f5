"""Who is calling a /ui page: the session's row and its token, and the CSRF check of its forms.

Every page resolves the caller from the session's access token with the gateway's own
authenticator (the token the provider gave at login, checked like a bearer token on every
request); every state-changing form carries the session's CSRF token (docs/ui.md).
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs, urlsplit

from fastapi import Request

from gateway.identity import ui_sessions
from gateway.identity.authn import InvalidToken
from gateway.identity.dependency import note_seen
from gateway.identity.principal import Principal
from gateway.kit.db import reading, transaction
from gateway.kit.errors import Forbidden


class LoginRequired(Exception):
    """No live session: the dashboard's handler sends the browser to log in (router.py install)."""


def csrf_token(request: Request) -> str:
    """The logged-in session's CSRF token (kept in its server-side row); set by principal_of."""
    return getattr(request.state, "ui_csrf", "")


async def posted_form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the first value of each), parsed here: no multipart dependency."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


async def posted_csrf(request: Request) -> str:
    """The `csrf` field of a urlencoded form (parsed here: no multipart dependency)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return parse_qs(body).get("csrf", [""])[0]


def check_csrf(request: Request, token: str) -> None:
    expected = csrf_token(request)
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        raise Forbidden("cross-site form refused")
    if not expected or not hmac.compare_digest(expected, token or ""):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page")


def principal_of(request: Request) -> Principal:
    """The caller of a /ui request: its session's row (not revoked, not expired) and that row's
    token, checked like a bearer token. Blocking (a query, maybe a key fetch): sync routes only."""
    sid = request.session.get("sid")
    if not sid:
        raise LoginRequired
    principal = None
    with reading(request.app.state.db) as session:  # a read on every page: no BEGIN / COMMIT (issue #46)
        row = ui_sessions.live(session, sid=sid)
    if row is not None:
        try:
            principal = request.app.state.authenticator.authenticate(row.access_token)
            request.state.ui_csrf = row.csrf
        except InvalidToken:  # its token expired or was revoked: so is the session
            with transaction(request.app.state.sessionmaker) as session:
                ui_sessions.revoke(session, sid=sid)
    if principal is None:  # logged out, expired, or never ours
        request.session.clear()
        raise LoginRequired
    note_seen(request, principal)  # a /ui visit keeps the caller's webhooks alive, as an API call does
    return principal
