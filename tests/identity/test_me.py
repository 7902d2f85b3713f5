"""GET /v1/me: what the gateway made of a token (#14, 5 and 6)."""

from __future__ import annotations

import pytest

from tests.conftest import gw  # noqa: F401  (the in-process gateway, SQLite and Postgres)


def test_me_shows_user_posix_user_accounts_admin_and_issuer(gw):
    me = gw.client.get("/v1/me", headers=gw.headers("alice", ("team-a", "team-z")))
    assert me.status_code == 200
    assert me.json() == {
        "subject": "dev:alice", "user": "alice", "kind": "user", "admin": False, "roles": [],
        "accounts": [{"name": "team-a", "role": "member", "exists": True},
                     {"name": "team-z", "role": "member", "exists": False}],
        "issuer": "urn:isthmus:dev-issuer",
    }


def test_me_for_an_admin_lists_every_account_and_how_it_is_granted(gw):
    me = gw.client.get("/v1/me", headers=gw.headers("root", ("team-a",), admin=True)).json()
    assert me["admin"] is True and me["roles"] == ["admin"]
    assert {(a["name"], a["role"]) for a in me["accounts"]} == {("team-a", "member"), ("team-b", "admin")}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not.a.token"}])
def test_me_needs_a_valid_token(gw, headers):
    r = gw.client.get("/v1/me", headers=headers)
    assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json")


def test_readyz_is_unavailable_when_no_issuer_can_validate_a_token(tmp_path):
    """The only issuer's keys cannot be fetched: nobody can log in, so not ready (was 200 "degraded")."""
    import json
    import socket

    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.cli import run_migrations
    from gateway.kit.settings import Settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    url = f"sqlite:///{tmp_path}/x.db"
    run_migrations(url)
    issuers = [{"issuer": "https://sso.example/realms/x", "jwks_uri": f"http://127.0.0.1:{dead}/certs",
                "http_timeout_s": 1}]
    with TestClient(create_app(Settings(database_url=url, oidc_issuers=json.dumps(issuers),
                                                   metrics_token="test-metrics-token"))) as client:
        r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "unavailable", r.json()
    assert "no token can be validated" in r.json()["identity_note"]


def test_without_a_pool_a_job_says_so_instead_of_waiting_for_dispatch(gw):
    spec = {"name": "x", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}
    job = gw.client.post("/v1/jobs", json=spec, headers=gw.headers()).json()
    assert job["state"] == "pending"
    assert job["state_reason"].startswith("no pool is configured on this gateway (ISTHMUS_POOLS_FILE or "
                                          "ISTHMUS_BACKENDS)")
    pools = gw.client.get("/v1/pools", headers=gw.headers()).json()
    assert pools["items"] == [] and pools["note"].startswith("no pool is configured")
    assert gw.client.get("/readyz").json()["pools"] == {}
