"""Fixtures for identity tests: the real Keycloak of stack/oidc, gateway apps, forged tokens.

Provider tests (``@pytest.mark.oidc``) read ``.stack/oidc/env`` written by
``stack/oidc/up.sh``; without it they skip, or fail when ISTHMUS_REQUIRE_STACK=1.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from joserfc import jwt
from joserfc.jwk import RSAKey
from sqlalchemy import func, select

from gateway.kit.settings import Settings

REPO = Path(__file__).resolve().parents[2]
ENV_FILE = REPO / ".stack" / "oidc" / "env"
ACCOUNTS = ("team-a", "team-b")
LOCAL_ISSUER = "https://local-test-issuer.invalid/realms/forge"

JOB = {
    "name": "identity-test", "account": "team-a", "backend": "auto", "command": ["python", "train.py"],
    "workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 2, "memory_per_worker": "4Gi", "time_limit": "1h",
}


def _read_env() -> dict[str, str]:
    out = {}
    for line in ENV_FILE.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


@pytest.fixture(scope="session")
def oidc_env() -> dict[str, str]:
    reason = None
    if not ENV_FILE.exists():
        reason = f"{ENV_FILE} missing: start the OpenID provider with `bash stack/oidc/up.sh`"
    else:
        env = _read_env()
        try:
            httpx.get(env["OIDC_ISSUER"] + "/.well-known/openid-configuration", timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            reason = f"the OpenID provider at {env['OIDC_BASE_URL']} does not answer ({type(exc).__name__})"
    if reason:
        if os.environ.get("ISTHMUS_REQUIRE_STACK") == "1":
            pytest.fail(reason + " (ISTHMUS_REQUIRE_STACK=1)")
        pytest.skip(reason)
    return env


class Provider:
    """Gets tokens from the real provider over HTTP, as clients do."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.http = httpx.Client(timeout=30)

    def _token(self, endpoint: str, form: dict[str, str]) -> str:
        r = self.http.post(endpoint, data=form)
        assert r.status_code == 200, f"token endpoint said {r.status_code}: {r.text[:300]}"
        return r.json()["access_token"]

    def password(self, user: str, *, client_id: str | None = None, ci_realm: bool = False) -> str:
        endpoint = self.env["OIDC_CI_TOKEN_ENDPOINT" if ci_realm else "OIDC_TOKEN_ENDPOINT"]
        return self._token(endpoint, {
            "grant_type": "password", "client_id": client_id or self.env["OIDC_CLIENT_ID"], "username": user,
            "password": user + self.env["OIDC_PASSWORD_SUFFIX"], "scope": "openid"})

    def ci_bot(self) -> str:
        return self._token(self.env["OIDC_TOKEN_ENDPOINT"], {
            "grant_type": "client_credentials", "client_id": self.env["OIDC_CI_BOT_CLIENT_ID"],
            "client_secret": self.env["OIDC_CI_BOT_CLIENT_SECRET"]})

    def ci_runner(self) -> str:
        return self._token(self.env["OIDC_CI_TOKEN_ENDPOINT"], {
            "grant_type": "client_credentials", "client_id": self.env["OIDC_CI_RUNNER_CLIENT_ID"],
            "client_secret": self.env["OIDC_CI_RUNNER_CLIENT_SECRET"]})

    def admin_api(self) -> httpx.Client:
        token = self._token(self.env["OIDC_ADMIN_TOKEN_ENDPOINT"], {
            "grant_type": "password", "client_id": "admin-cli", "username": self.env["OIDC_ADMIN_USER"],
            "password": self.env["OIDC_ADMIN_PASSWORD"]})
        return httpx.Client(base_url=self.env["OIDC_ADMIN_API"], timeout=60,
                            headers={"Authorization": f"Bearer {token}"})

    def jwks(self) -> dict:
        return self.http.get(self.env["OIDC_ISSUER"] + "/protocol/openid-connect/certs").json()


@pytest.fixture(scope="session")
def provider(oidc_env) -> Provider:
    return Provider(oidc_env)


def issuer_configs(env: dict[str, str], **overrides) -> list[dict]:
    """The two realms as a site would configure them (docs/identity.md)."""
    staff = {"issuer": env["OIDC_ISSUER"], "label": "staff realm", "audience": env["OIDC_AUDIENCE"],
             "algorithms": ["RS256"], "min_refresh_interval_s": 0,
             "claims": {"service_accounts": {"ci-bot": ["team-a"]}, "service_users": {"ci-bot": "cibot"}}}
    ci = {"issuer": env["OIDC_CI_ISSUER"], "label": "ci realm", "audience": env["OIDC_AUDIENCE"],
          "claims": {"service_users": {"runner": "runner"}}}
    staff.update(overrides)
    return [staff, ci]


def _migrate_and_seed(url: str) -> None:
    from gateway.cli import run_migrations
    from gateway.kit.db import make_engine, make_sessionmaker, transaction
    from gateway.models.accounts import Account

    run_migrations(url)
    engine = make_engine(url)
    with transaction(make_sessionmaker(engine)) as session:
        for name in ACCOUNTS:
            if session.get(Account, name) is None:
                session.add(Account(name=name, shares=1))
    engine.dispose()


@pytest.fixture
def make_client(tmp_path) -> Iterator[Callable[..., TestClient]]:
    """Build a gateway app (lifespan running) trusting the given issuers."""
    from gateway.app import create_app

    stack: list[TestClient] = []

    def build(*, issuers: list[dict] | None = None, extra_routers=(), **settings) -> TestClient:
        url = f"sqlite:///{tmp_path}/gw-{len(stack)}.db"
        _migrate_and_seed(url)
        settings.setdefault("metrics_token", "test-metrics-token")  # outside dev mode /metrics needs one
        app = create_app(Settings(database_url=url, oidc_issuers=json.dumps(issuers or []),
                                  dev_key_path=tmp_path / "dev-key.pem", **settings))
        for r in extra_routers:
            app.include_router(r)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        stack.append(client)
        return client

    yield build
    for c in reversed(stack):
        c.__exit__(None, None, None)


@pytest.fixture
def oidc_client(oidc_env, make_client) -> TestClient:
    return make_client(issuers=issuer_configs(oidc_env))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def job_count(client: TestClient) -> int:
    from gateway.models.jobs import Job

    with client.app.state.sessionmaker() as session:
        return session.scalar(select(func.count()).select_from(Job))


def submit(client: TestClient, token: str, account: str = "team-a", **extra):
    return client.post("/v1/jobs", json={**JOB, "account": account, **extra}, headers=bearer(token))


# ------------------------------------------------------------------ forging


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64json(obj) -> str:
    return b64(json.dumps(obj, separators=(",", ":")).encode())


def segments(token: str) -> tuple[dict, dict, str]:
    h, p, s = token.split(".")
    pad = lambda x: x + "=" * (-len(x) % 4)  # noqa: E731
    return json.loads(base64.urlsafe_b64decode(pad(h))), json.loads(base64.urlsafe_b64decode(pad(p))), s


class LocalSigner:
    """Our own RSA key, registered as a trusted issuer in a second test app (fake provider)."""

    def __init__(self, kid: str = "forge-1"):
        self.key = RSAKey.generate_key(2048, {"kid": kid}, private=True)
        self.kid = kid

    def public_jwks(self) -> dict:
        return {"keys": [{**self.key.as_dict(private=False), "use": "sig", "alg": "RS256"}]}

    def claims(self, **over) -> dict:
        now = int(time.time())
        base = {"iss": LOCAL_ISSUER, "aud": "isthmus", "sub": "forged-alice", "preferred_username": "alice",
                "groups": ["team-a"], "iat": now, "nbf": now, "exp": now + 300}
        base.update(over)
        return {k: v for k, v in base.items() if v is not None}

    def sign(self, claims: dict, *, kid: str | None = None, alg: str = "RS256") -> str:
        return jwt.encode({"alg": alg, "kid": kid or self.kid}, claims, self.key, algorithms=[alg])


class JwksServer:
    """Serves one JWKS document on loopback over real HTTP (for the local signer)."""

    def __init__(self, jwks: dict):
        import http.server

        server = self
        self.serve(jwks)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = server.body
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, jwks: dict) -> None:
        """Publish this document from now on (the provider rotated or withdrew keys)."""
        self.body = json.dumps(jwks).encode()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def local_signer() -> LocalSigner:
    return LocalSigner()


@pytest.fixture
def local_client(make_client, local_signer) -> Iterator[TestClient]:
    server = JwksServer(local_signer.public_jwks())
    try:
        yield make_client(issuers=[{"issuer": LOCAL_ISSUER, "jwks_uri": server.url, "label": "forge",
                                    "leeway_s": 5, "algorithms": ["RS256"],
                                    "required_claims": ["preferred_username"]}])
    finally:
        server.close()


class TcpProxy:
    """A loopback TCP forwarder to the provider that a test can cut (provider down)."""

    def __init__(self, target_port: int, listen_port: int = 0):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", listen_port))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while self.running:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        self.running = False
        try:  # wakes the thread blocked in accept(); close() alone would not stop listening
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass
