"""Validated tokens are remembered (issue #32), never past their exp nor their issuer's keys.

The provider here is the local signer's JWKS served over real HTTP (JwksServer), which a test
can rotate; the Keycloak-backed tests in test_keys.py run with the cache on (the default) and
show that scheduled refreshes and a provider outage behave as before."""

from __future__ import annotations

import time

import pytest

from gateway.identity.authn import Authenticator
from tests.identity.conftest import LOCAL_ISSUER, JwksServer, LocalSigner, bearer


@pytest.fixture
def jwks_server(local_signer):
    server = JwksServer(local_signer.public_jwks())
    yield server
    server.close()


def _client(make_client, server, **settings):
    return make_client(issuers=[{"issuer": LOCAL_ISSUER, "jwks_uri": server.url, "label": "forge", "leeway_s": 0,
                                 "algorithms": ["RS256"], "min_refresh_interval_s": 0}], **settings)


@pytest.fixture
def validations(monkeypatch):
    """How many times a token's signature and claims were checked in full."""
    count = {"n": 0}
    real = Authenticator._validate

    def counting(self, token):
        count["n"] += 1
        return real(self, token)

    monkeypatch.setattr(Authenticator, "_validate", counting)
    return count


def test_a_token_is_checked_once_then_remembered(make_client, jwks_server, local_signer, validations):
    client = _client(make_client, jwks_server)
    token = local_signer.sign(local_signer.claims())
    for _ in range(5):
        assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    body = {"name": "x", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1,
            "cpus_per_worker": 1, "memory_per_worker": "1Gi"}
    assert client.post("/v1/jobs", json=body, headers=bearer(token)).status_code == 202
    assert validations["n"] == 1
    other = local_signer.sign(local_signer.claims(sub="forged-bob", preferred_username="bob"))
    assert client.get("/v1/jobs", headers=bearer(other)).status_code == 200
    assert validations["n"] == 2


def test_turned_off_every_request_checks_the_token(make_client, jwks_server, local_signer, validations):
    client = _client(make_client, jwks_server, token_cache_s=0)
    token = local_signer.sign(local_signer.claims())
    for _ in range(3):
        assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    assert validations["n"] == 3


def test_a_remembered_token_still_expires(make_client, jwks_server, local_signer):
    client = _client(make_client, jwks_server)
    token = local_signer.sign(local_signer.claims(exp=int(time.time()) + 2))
    assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    time.sleep(2.2)
    r = client.get("/v1/jobs", headers=bearer(token))
    assert r.status_code == 401 and r.json()["detail"].startswith("token expired"), r.text


def test_a_bad_token_is_never_remembered(make_client, jwks_server, local_signer, validations):
    client = _client(make_client, jwks_server)
    forged = LocalSigner().sign(local_signer.claims())  # our kid, another key
    for _ in range(3):
        r = client.get("/v1/jobs", headers=bearer(forged))
        assert r.status_code == 401 and r.json()["detail"].startswith("bad signature")
    assert validations["n"] == 3


def test_a_key_the_provider_withdrew_stops_remembered_tokens_at_once(make_client, jwks_server, local_signer):
    client = _client(make_client, jwks_server)
    old = local_signer.sign(local_signer.claims())
    assert client.get("/v1/jobs", headers=bearer(old)).status_code == 200
    # The provider rotates: a new key under a new kid, the old one withdrawn.
    rotated = LocalSigner(kid="forge-2")
    jwks_server.serve(rotated.public_jwks())
    new = rotated.sign(rotated.claims())
    assert client.get("/v1/jobs", headers=bearer(new)).status_code == 200  # unknown kid: keys fetched again
    r = client.get("/v1/jobs", headers=bearer(old))
    assert r.status_code == 401 and r.json()["detail"] == "unknown key id", r.text


def test_a_key_replaced_under_the_same_kid_stops_remembered_tokens(make_client, jwks_server, local_signer):
    client = _client(make_client, jwks_server)
    old = local_signer.sign(local_signer.claims())
    assert client.get("/v1/jobs", headers=bearer(old)).status_code == 200
    replaced = LocalSigner(kid=local_signer.kid)
    jwks_server.serve(replaced.public_jwks())
    keys = next(iter(client.app.state.authenticator.issuers.values())).keys
    assert keys.refresh(reason="schedule")  # what the 10-minute schedule does
    r = client.get("/v1/jobs", headers=bearer(old))
    assert r.status_code == 401 and r.json()["detail"].startswith("bad signature"), r.text
    assert client.get("/v1/jobs", headers=bearer(replaced.sign(replaced.claims()))).status_code == 200


def test_the_cache_is_bounded(make_client, jwks_server, local_signer, monkeypatch):
    monkeypatch.setattr(Authenticator, "CACHE_MAX", 3)
    client = _client(make_client, jwks_server)
    tokens = [local_signer.sign(local_signer.claims(sub=f"user-{n}")) for n in range(6)]
    for token in tokens:
        assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    assert len(client.app.state.authenticator._validated) <= 3
    assert client.get("/v1/jobs", headers=bearer(tokens[0])).status_code == 200  # evicted: checked again


def test_remembered_tokens_still_start_the_scheduled_key_refresh(make_client, jwks_server, local_signer):
    client = _client(make_client, jwks_server)
    keys = next(iter(client.app.state.authenticator.issuers.values())).keys
    token = local_signer.sign(local_signer.claims())
    assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    before = keys.fetches
    keys.last_attempt_at -= 601  # as if ten minutes had passed
    keys.last_success_at -= 601
    assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200  # served from the cache
    deadline = time.monotonic() + 10
    while keys.fetches == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert keys.fetches == before + 1
