"""The provider's keys: cache, rate-limited refresh, provider down, rotation at the provider."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest

from tests.identity.conftest import (
    LocalSigner,
    TcpProxy,
    bearer,
    issuer_configs,
    segments,
)

pytestmark = pytest.mark.oidc


def _staff_keys(client):
    return next(i for i in client.app.state.authenticator.issuers.values() if i.label == "staff realm").keys


def _wait(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_flood_of_unknown_kids_fetches_at_most_once_per_interval(make_client, provider, oidc_env):
    client = make_client(issuers=issuer_configs(oidc_env, min_refresh_interval_s=30))
    keys = _staff_keys(client)
    _, payload, _ = segments(provider.password("alice"))
    forger = LocalSigner()
    before = keys.fetches
    for n in range(40):
        r = client.get("/v1/jobs", headers=bearer(forger.sign(payload, kid=f"bogus-{n}")))
        assert r.status_code == 401 and r.json()["detail"] == "unknown key id"
    assert keys.fetches - before <= 1
    assert client.get("/v1/jobs", headers=bearer(provider.password("alice"))).status_code == 200


def test_keys_are_refreshed_on_schedule_without_blocking_requests(make_client, provider, oidc_env):
    client = make_client(issuers=issuer_configs(oidc_env, refresh_interval_s=600))
    keys = _staff_keys(client)
    alice = provider.password("alice")
    before = keys.fetches
    assert client.get("/v1/jobs", headers=bearer(alice)).status_code == 200
    assert keys.fetches == before  # fresh: served from the cache
    keys.last_success_at -= 601  # as if ten minutes had passed
    keys.last_attempt_at -= 601
    assert client.get("/v1/jobs", headers=bearer(alice)).status_code == 200
    assert _wait(lambda: keys.fetches == before + 1 and keys.error is None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_provider_unreachable_at_start_the_gateway_still_starts(make_client, provider, oidc_env):
    dead = f"http://127.0.0.1:{_free_port()}/realms/isthmus/protocol/openid-connect/certs"
    client = make_client(issuers=issuer_configs(oidc_env, jwks_uri=dead, http_timeout_s=2))
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "degraded"
    staff = ready.json()["identity"]["staff realm"]
    assert staff == {"ok": False, "issuer": oidc_env["OIDC_ISSUER"], "keys": 0, "reason": "provider unreachable"}
    r = client.get("/v1/jobs", headers=bearer(provider.password("alice")))
    assert r.status_code == 401 and r.json()["detail"] == "keys unavailable"
    assert r.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
    # the other issuer is unaffected
    assert client.get("/v1/jobs", headers=bearer(provider.ci_runner())).status_code == 200
    assert client.get("/healthz").status_code == 200


def test_provider_going_down_keeps_cached_keys_in_service(make_client, provider, oidc_env):
    port = urlsplit(oidc_env["OIDC_BASE_URL"]).port
    proxy = TcpProxy(port)
    try:
        jwks = f"http://127.0.0.1:{proxy.port}/realms/isthmus/protocol/openid-connect/certs"
        client = make_client(issuers=issuer_configs(oidc_env, jwks_uri=jwks, http_timeout_s=2))
        keys = _staff_keys(client)
        alice = provider.password("alice")
        assert client.get("/v1/jobs", headers=bearer(alice)).status_code == 200
        assert client.get("/readyz").json()["status"] == "ok"

        proxy.stop()  # the provider is gone for the gateway
        keys.last_success_at -= 601
        keys.last_attempt_at -= 601
        assert client.get("/v1/jobs", headers=bearer(alice)).status_code == 200  # triggers the refresh
        assert _wait(lambda: keys.error is not None)
        ready = client.get("/readyz").json()
        assert ready["status"] == "degraded"
        assert ready["identity"]["staff realm"]["ok"] is False
        assert ready["identity"]["staff realm"]["reason"] == "provider unreachable"
        assert ready["identity"]["staff realm"]["keys"] >= 1
        # cached keys keep working for every user; nothing crashes
        for user in ("alice", "bob", "root-admin"):
            assert client.get("/v1/jobs", headers=bearer(provider.password(user))).status_code == 200
        r = client.post("/v1/jobs", json={"name": "x", "account": "team-a", "command": ["true"], "workers": 1,
                                          "gpus_per_worker": 1, "cpus_per_worker": 1, "memory_per_worker": "1Gi"},
                        headers=bearer(alice))
        assert r.status_code == 202, r.text
        # an unknown kid now costs one failed fetch, then a plain 401
        _, payload, _ = segments(alice)
        r = client.get("/v1/jobs", headers=bearer(LocalSigner().sign(payload, kid="rotated-maybe")))
        assert r.status_code == 401 and r.json()["detail"] == "unknown key id"

        # the provider comes back: a background retry (not the 10-minute schedule) heals /readyz
        proxy = TcpProxy(port, listen_port=proxy.port)
        keys.last_attempt_at -= 11
        assert client.get("/v1/jobs", headers=bearer(alice)).status_code == 200
        assert _wait(lambda: keys.error is None)
        assert client.get("/readyz").json()["status"] == "ok"
    finally:
        proxy.stop()


# Rotation changes the realm for every later test, so it runs last in this module.
def test_key_rotation_at_the_provider_is_picked_up_without_restart(make_client, provider, oidc_env):
    client = make_client(issuers=issuer_configs(oidc_env, min_refresh_interval_s=0))
    old_token = provider.password("alice")
    old_kid = segments(old_token)[0]["kid"]
    assert client.get("/v1/jobs", headers=bearer(old_token)).status_code == 200

    admin = provider.admin_api()
    realm_id = admin.get("/isthmus").json()["id"]
    providers = admin.get("/isthmus/components", params={"type": "org.keycloak.keys.KeyProvider"}).json()
    rsa = [p for p in providers if p["providerId"] in ("rsa-generated", "rsa")]
    top = max(int(p["config"].get("priority", ["0"])[0]) for p in rsa)
    name = f"rotated-{int(time.time())}"
    r = admin.post("/isthmus/components", json={
        "name": name, "providerId": "rsa-generated", "providerType": "org.keycloak.keys.KeyProvider",
        "parentId": realm_id, "config": {"priority": [str(top + 10)], "keySize": ["2048"], "active": ["true"],
                                         "enabled": ["true"], "algorithm": ["RS256"]}})
    assert r.status_code == 201, r.text

    new_token = provider.password("alice")
    new_kid = segments(new_token)[0]["kid"]
    assert new_kid != old_kid
    assert client.get("/v1/jobs", headers=bearer(new_token)).status_code == 200  # unknown kid -> refetch
    assert client.get("/v1/jobs", headers=bearer(old_token)).status_code == 200  # old key still published

    for p in rsa:  # retire every older signing key
        assert admin.delete(f"/isthmus/components/{p['id']}").status_code == 204
    # Any refresh now drops the old key; an unknown kid is one way to cause it.
    _, payload, _ = segments(new_token)
    client.get("/v1/jobs", headers=bearer(LocalSigner().sign(payload, kid="trigger-refresh")))
    r = client.get("/v1/jobs", headers=bearer(old_token))
    assert r.status_code == 401 and r.json()["detail"] == "unknown key id"
    assert client.get("/v1/jobs", headers=bearer(provider.password("bob"))).status_code == 200
    assert client.get("/readyz").json()["identity"]["staff realm"]["ok"] is True
