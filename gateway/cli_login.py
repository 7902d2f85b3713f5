"""``isthmus login`` / ``logout``: OIDC tokens for the CLI, cached per issuer (docs/cli.md).

Two flows, both with authlib's OAuth 2.0 client:

- the Device Authorization Grant (RFC 8628) for an SSH session on a login node: the CLI
  prints a short code and a URL, the person approves it in any browser, the CLI polls;
- the authorization code with PKCE (RFC 7636) and a loopback redirect (RFC 8252 §7.3)
  where a browser runs on the same machine.

Tokens are cached in ``<config dir>/tokens.json`` (mode 0600, directory 0700), one entry per
issuer, and refreshed with the refresh token when the access token is about to expire.
Nothing here logs a token.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import click

DEFAULT_CLIENT_ID = "isthmus"
SCOPE = "openid"
# Refresh this many seconds before the access token expires, so a command does not fail
# half-way through because its token ran out in flight.
EXPIRY_MARGIN_S = 30
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class LoginError(click.ClickException):
    pass


# ------------------------------------------------------------------- the cache


def config_dir() -> Path:
    """ISTHMUS_CONFIG_DIR, else $XDG_CONFIG_HOME/isthmus, else ~/.config/isthmus."""
    if os.environ.get("ISTHMUS_CONFIG_DIR"):
        return Path(os.environ["ISTHMUS_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "isthmus"


def cache_path() -> Path:
    return config_dir() / "tokens.json"


def load_cache() -> dict[str, Any]:
    try:
        data = json.loads(cache_path().read_text())
    except FileNotFoundError:
        return {"current": None, "issuers": {}}
    except (OSError, ValueError) as exc:
        raise LoginError(f"cannot read the token cache {cache_path()}: {exc}; "
                         "remove it and run `isthmus login` again") from None
    data.setdefault("issuers", {})
    data.setdefault("current", None)
    return data


def save_cache(data: dict[str, Any]) -> None:
    """Write atomically; the file is created 0600 so a token is never readable by others."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------- the provider


def discover(issuer: str) -> dict[str, Any]:
    import httpx

    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        r = httpx.get(url, timeout=15)
        r.raise_for_status()
        return r.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise LoginError(f"cannot read the provider's configuration at {url}: {exc}") from None


def _oauth_client(client_id: str, **kw):
    # authlib's requests integration: its httpx one now warns on import (it moves to httpx2).
    from authlib.integrations.requests_client import OAuth2Session

    return OAuth2Session(client_id=client_id, token_endpoint_auth_method="none", scope=SCOPE,
                         default_timeout=30, **kw)


def _stored(token: dict[str, Any]) -> dict[str, Any]:
    keep = ("access_token", "refresh_token", "id_token", "token_type", "expires_at", "refresh_expires_in", "scope")
    out = {k: token[k] for k in keep if k in token}
    if "expires_at" not in out and "expires_in" in token:
        out["expires_at"] = int(time.time()) + int(token["expires_in"])
    return out


def _remember(issuer: str, client_id: str, meta: dict[str, Any], token: dict[str, Any]) -> None:
    data = load_cache()
    data["issuers"][issuer] = {"client_id": client_id, "token_endpoint": meta["token_endpoint"],
                               "revocation_endpoint": meta.get("revocation_endpoint"),
                               "token": _stored(token), "saved_at": int(time.time())}
    data["current"] = issuer
    save_cache(data)


def _oauth_error(exc: Exception) -> str:
    return getattr(exc, "error", None) or type(exc).__name__


def device_flow(issuer: str, client_id: str, meta: dict[str, Any], *, echo=click.echo,
                timeout_s: float = 600) -> dict[str, Any]:
    """RFC 8628: print the code and URL, then poll the token endpoint until approved."""
    from authlib.common.errors import AuthlibBaseError

    endpoint = meta.get("device_authorization_endpoint")
    if not endpoint:
        raise LoginError(f"{issuer} does not offer the device authorization grant; use --browser")
    with _oauth_client(client_id) as client:
        r = client.post(endpoint, data={"client_id": client_id, "scope": SCOPE}, withhold_token=True)
        if r.status_code != 200:
            raise LoginError(f"the provider refused the device authorization ({r.status_code}): "
                             f"{r.text[:300]}; is the device grant enabled for client {client_id!r}?")
        grant = r.json()
        interval = int(grant.get("interval") or 5)
        url = grant.get("verification_uri_complete") or grant["verification_uri"]
        echo(f"To log in, open {url}\nand confirm the code {grant['user_code']}.", err=True)
        deadline = time.monotonic() + min(timeout_s, float(grant.get("expires_in") or timeout_s))
        while time.monotonic() < deadline:
            time.sleep(interval)
            try:
                return client.fetch_token(meta["token_endpoint"], grant_type=DEVICE_GRANT,
                                          device_code=grant["device_code"])
            except AuthlibBaseError as exc:
                error = _oauth_error(exc)
                if error == "authorization_pending":
                    continue
                if error == "slow_down":
                    interval += 5
                    continue
                raise LoginError(f"login failed: {error}: {getattr(exc, 'description', '') or ''}") from None
    raise LoginError("the code was not confirmed in time; run `isthmus login` again")


class _Callback(http.server.BaseHTTPRequestHandler):
    """Receives the one redirect from the provider on the loopback interface."""

    result: dict[str, str]
    done: threading.Event

    def do_GET(self):
        parsed = urllib.parse.urlsplit(self.path)
        if parsed.path != "/callback":
            self.send_error(404)
            return
        self.server.result = dict(urllib.parse.parse_qsl(parsed.query))  # type: ignore[attr-defined]
        body = b"<!doctype html><title>Isthmus</title><p>Logged in. You can close this tab.</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.done.set()  # type: ignore[attr-defined]

    def log_message(self, *args):  # the query holds the authorization code: never log it
        pass


def browser_flow(issuer: str, client_id: str, meta: dict[str, Any], *, open_browser: bool = True,
                 echo=click.echo, timeout_s: float = 300) -> dict[str, Any]:
    """Authorization code + PKCE (S256) with a redirect to a one-shot server on 127.0.0.1."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Callback)
    server.result = {}  # type: ignore[attr-defined]
    server.done = threading.Event()  # type: ignore[attr-defined]
    redirect_uri = f"http://127.0.0.1:{server.server_address[1]}/callback"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        verifier = secrets.token_urlsafe(64)
        state = secrets.token_urlsafe(24)
        with _oauth_client(client_id, redirect_uri=redirect_uri, code_challenge_method="S256") as client:
            url, _ = client.create_authorization_url(meta["authorization_endpoint"], state=state,
                                                     code_verifier=verifier)
            echo(f"To log in, open this page in a browser on this machine:\n{url}", err=True)
            if open_browser:
                import webbrowser

                webbrowser.open(url)
            if not server.done.wait(timeout_s):  # type: ignore[attr-defined]
                raise LoginError("no answer from the browser in time; run `isthmus login` again "
                                 "(or `isthmus login --device`)")
            result: dict[str, str] = server.result  # type: ignore[attr-defined]
            if result.get("state") != state:
                raise LoginError("the provider's answer does not carry this login's state; try again")
            if "error" in result:
                raise LoginError(f"login failed: {result['error']}: {result.get('error_description', '')}")
            from authlib.common.errors import AuthlibBaseError

            try:
                return client.fetch_token(meta["token_endpoint"], grant_type="authorization_code",
                                          code=result["code"], code_verifier=verifier, redirect_uri=redirect_uri)
            except AuthlibBaseError as exc:
                raise LoginError(f"login failed: {_oauth_error(exc)}") from None
    finally:
        server.shutdown()
        server.server_close()


def login(issuer: str, client_id: str, *, flow: str, open_browser: bool = True, echo=click.echo) -> dict[str, Any]:
    meta = discover(issuer)
    if flow == "device":
        token = device_flow(issuer, client_id, meta, echo=echo)
    else:
        token = browser_flow(issuer, client_id, meta, open_browser=open_browser, echo=echo)
    _remember(issuer, client_id, meta, token)
    return token


def choose_flow(flow: str) -> str:
    """`auto`: the device grant in an SSH session or without a display, else the browser."""
    if flow != "auto":
        return flow
    if os.environ.get("SSH_CONNECTION") or os.environ.get("SSH_TTY"):
        return "device"
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and os.name == "posix" \
            and os.uname().sysname != "Darwin":
        return "device"
    return "browser"


# ------------------------------------------------------------------- using the cache


def cached_access_token(issuer: str | None = None) -> str | None:
    """The cached access token for `issuer` (default: the last one logged in to), refreshed
    with its refresh token when it expires within EXPIRY_MARGIN_S; None when not logged in."""
    data = load_cache()
    issuer = issuer or data.get("current")
    entry = data["issuers"].get(issuer) if issuer else None
    if not entry:
        return None
    token = entry["token"]
    if int(token.get("expires_at") or 0) - EXPIRY_MARGIN_S > time.time():
        return token["access_token"]
    if not token.get("refresh_token"):
        raise LoginError(f"the token for {issuer} has expired; run `isthmus login` again")
    from authlib.common.errors import AuthlibBaseError

    try:
        with _oauth_client(entry["client_id"]) as client:
            fresh = client.refresh_token(entry["token_endpoint"], refresh_token=token["refresh_token"])
    except AuthlibBaseError as exc:
        raise LoginError(f"the session with {issuer} has ended ({_oauth_error(exc)}); "
                         "run `isthmus login` again") from None
    except Exception as exc:  # noqa: BLE001 - network errors: say which provider, not a traceback
        raise LoginError(f"cannot refresh the token with {issuer}: {type(exc).__name__}: {exc}") from None
    fresh = dict(fresh)
    fresh.setdefault("refresh_token", token["refresh_token"])  # providers may not rotate it
    data = load_cache()
    data["issuers"][issuer] = {**entry, "token": _stored(fresh), "saved_at": int(time.time())}
    save_cache(data)
    return fresh["access_token"]


def logout(issuer: str | None = None) -> str | None:
    """Forget the cached tokens of `issuer` (default: the current one) and revoke the refresh
    token at the provider when it offers revocation (best effort: the local copy goes anyway)."""
    data = load_cache()
    issuer = issuer or data.get("current")
    entry = data["issuers"].pop(issuer, None) if issuer else None
    if entry is None:
        return None
    if data.get("current") == issuer:
        data["current"] = next(iter(data["issuers"]), None)
    save_cache(data)
    refresh = entry["token"].get("refresh_token")
    if refresh and entry.get("revocation_endpoint"):
        try:
            with _oauth_client(entry["client_id"]) as client:
                client.revoke_token(entry["revocation_endpoint"], token=refresh, token_type_hint="refresh_token")
        except Exception:  # noqa: BLE001, S110 - the provider may be away; the local tokens are gone already
            pass
    return issuer


# ------------------------------------------------------------------- the commands


def register(main: click.Group) -> None:
    @main.command("login")
    @click.option("--issuer", envvar="ISTHMUS_ISSUER", required=True, show_envvar=True,
                  help="your organisation's OpenID provider (issuer URL)")
    @click.option("--client-id", envvar="ISTHMUS_CLIENT_ID", default=DEFAULT_CLIENT_ID, show_default=True,
                  show_envvar=True, help="the public OIDC client registered for the CLI")
    @click.option("--device", "flow", flag_value="device",
                  help="device code: approve on any browser (for SSH sessions)")
    @click.option("--browser", "flow", flag_value="browser",
                  help="open a browser here (authorization code + PKCE, loopback redirect)")
    @click.option("--no-open", is_flag=True, help="with --browser: print the URL instead of opening a browser")
    def login_cmd(issuer: str, client_id: str, flow: str | None, no_open: bool) -> None:
        """Log in with your organisation's OpenID provider; later commands use the cached token."""
        issuer = issuer.rstrip("/")
        login(issuer, client_id, flow=choose_flow(flow or "auto"), open_browser=not no_open)
        click.echo(f"Logged in to {issuer}; tokens cached in {cache_path()}")

    @main.command("logout")
    @click.option("--issuer", envvar="ISTHMUS_ISSUER", default=None, help="default: the last one logged in to")
    def logout_cmd(issuer: str | None) -> None:
        """Forget the cached tokens (and revoke the refresh token at the provider)."""
        gone = logout(issuer.rstrip("/") if issuer else None)
        click.echo(f"Logged out of {gone}" if gone else "Not logged in")
