"""Logging in and out of the dashboard: the OIDC authorisation-code flow (PKCE) and the
server-side session row it leaves (gateway/identity/ui_sessions.py; docs/ui.md, "Sessions")."""

from __future__ import annotations

import logging
import warnings
from datetime import UTC, datetime

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import RedirectResponse

from gateway.identity import ui_sessions
from gateway.identity.authn import InvalidToken
from gateway.kit.db import transaction
from gateway.ui.auth import check_csrf, posted_csrf
from gateway.ui.rendering import error_page, render

log = logging.getLogger("isthmus.ui")
# The login-failure page's only text: never the provider's error_description (#27, finding 10).
LOGIN_FAILED = "The login did not complete. Try again; if it keeps failing, ask your administrator."
router = APIRouter(prefix="/ui", include_in_schema=False)


def configure(app: FastAPI) -> None:
    """The OIDC client of the dashboard's login (``app.state.ui_oauth``), None without an issuer."""
    settings = app.state.settings
    app.state.ui_oauth = None
    if settings.ui_oidc_issuer:
        with warnings.catch_warnings():  # authlib's httpx integration warns about httpx2 on import
            warnings.simplefilter("ignore")
            from authlib.integrations.starlette_client import OAuth
        oauth = OAuth()
        kwargs = {"scope": "openid", "code_challenge_method": "S256"}
        if not settings.ui_client_secret:
            kwargs["token_endpoint_auth_method"] = "none"
        oauth.register("isthmus", client_id=settings.ui_client_id,
                       client_secret=settings.ui_client_secret or None,
                       server_metadata_url=settings.ui_oidc_issuer.rstrip("/") + "/.well-known/openid-configuration",
                       client_kwargs=kwargs)
        app.state.ui_oauth = oauth.isthmus


def oauth_client(request: Request):
    return getattr(request.app.state, "ui_oauth", None)


@router.get("/login", name="ui_login")
async def login(request: Request, next: str = "/ui/"):
    client = oauth_client(request)
    if client is None:
        return render(request, "unconfigured.html", {}, status=503)
    request.session["next"] = next if next.startswith("/ui/") and not next.startswith("//") else "/ui/"
    return await client.authorize_redirect(request, str(request.url_for("ui_callback")))


@router.get("/auth/callback", name="ui_callback")
async def callback(request: Request):
    from authlib.integrations.base_client import OAuthError

    client = oauth_client(request)
    if client is None:
        return render(request, "unconfigured.html", {}, status=503)
    try:
        token = await client.authorize_access_token(request)
        principal = request.app.state.authenticator.authenticate(token["access_token"])
    except (OAuthError, InvalidToken) as exc:
        # The provider's text is whatever the query string said (anyone can craft the link):
        # it goes to the log, and the page says only what happened (docs/ui.md).
        log.warning("ui login failed: %s", str(exc)[:500])
        return error_page(request, status=401, title="Login failed", detail=LOGIN_FAILED)
    expires = token.get("expires_at")
    nxt = request.session.pop("next", "/ui/")

    def store() -> str:
        with transaction(request.app.state.sessionmaker) as session:
            return ui_sessions.create(session, access_token=token["access_token"], subject=principal.subject,
                                      token_expires_at=datetime.fromtimestamp(expires, UTC) if expires else None)

    sid = await anyio.to_thread.run_sync(store)
    request.session.clear()  # the login's OAuth state goes; the cookie now holds only the session id
    request.session["sid"] = sid
    return RedirectResponse(nxt, status_code=303)


@router.post("/logout", name="ui_logout")
def logout(request: Request, csrf: str = Depends(posted_csrf)):
    sid = request.session.get("sid")
    with transaction(request.app.state.sessionmaker) as session:
        row = ui_sessions.get(session, sid=sid) if sid else None
        if row is not None:  # a session that is already gone has nothing to end
            request.state.ui_csrf = row.csrf
            check_csrf(request, csrf)
            ui_sessions.revoke(session, sid=sid)  # the old cookie, replayed, finds nothing
    request.session.clear()
    # Not straight back to /ui/login: the provider's own session would log the person in again.
    return RedirectResponse("/ui/logged-out", status_code=303)


@router.get("/logged-out", name="ui_logged_out")
def logged_out(request: Request):
    return render(request, "logged_out.html", {})
