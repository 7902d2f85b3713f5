"""The gateway against the real Keycloak of stack/oidc: tokens from its token endpoint."""

from __future__ import annotations

import time

import pytest

from tests.identity.conftest import bearer, issuer_configs, job_count, submit

pytestmark = pytest.mark.oidc


def test_valid_user_token_lists_and_submits(oidc_client, provider):
    alice = provider.password("alice")
    r = oidc_client.get("/v1/jobs", headers=bearer(alice))
    assert r.status_code == 200, r.text
    r = submit(oidc_client, alice, "team-a")
    assert r.status_code == 202, r.text
    assert r.json()["user"] == "alice" and r.json()["account"] == "team-a"


def test_users_are_confined_to_their_accounts(oidc_client, provider):
    alice, bob, carol, dave = (provider.password(u) for u in ("alice", "bob", "carol", "dave"))
    bobs = submit(oidc_client, bob, "team-b").json()["id"]
    alices = submit(oidc_client, alice, "team-a").json()["id"]

    # alice cannot see, list, follow or cancel bob's team-b job: it does not exist for her
    assert oidc_client.get(f"/v1/jobs/{bobs}", headers=bearer(alice)).status_code == 404
    assert oidc_client.get(f"/v1/jobs/{bobs}/events", headers=bearer(alice)).status_code == 404
    assert oidc_client.post(f"/v1/jobs/{bobs}/cancel", headers=bearer(alice)).status_code == 404
    listed = {j["id"] for j in oidc_client.get("/v1/jobs", headers=bearer(alice)).json()["items"]}
    assert alices in listed and bobs not in listed
    assert oidc_client.get("/v1/jobs", params={"account": "team-b"}, headers=bearer(alice)).json()["items"] == []
    # ... nor charge team-b
    before = job_count(oidc_client)
    r = submit(oidc_client, alice, "team-b")
    assert r.status_code == 403 and job_count(oidc_client) == before
    assert oidc_client.get(f"/v1/jobs/{bobs}", headers=bearer(bob)).json()["state"] == "pending"

    # carol is in both teams; dave in none
    listed = {j["id"] for j in oidc_client.get("/v1/jobs", headers=bearer(carol)).json()["items"]}
    assert {alices, bobs} <= listed
    assert oidc_client.get("/v1/jobs", headers=bearer(dave)).json()["items"] == []
    assert submit(oidc_client, dave, "team-a").status_code == 403


def test_admin_routes_need_the_admin_group(oidc_client, provider):
    admin = provider.password("root-admin")
    r = oidc_client.get("/v1/admin/accounts", headers=bearer(admin))
    assert r.status_code == 200, r.text
    assert "team-a" in r.text and "team-b" in r.text
    for token in (provider.password("alice"), provider.password("carol"), provider.ci_bot()):
        r = oidc_client.get("/v1/admin/accounts", headers=bearer(token))
        assert r.status_code == 403, r.text
    assert oidc_client.get("/v1/admin/accounts").status_code == 401
    # the admin sees every account's jobs
    bobs = submit(oidc_client, provider.password("bob"), "team-b").json()["id"]
    assert oidc_client.get(f"/v1/jobs/{bobs}", headers=bearer(admin)).status_code == 200


def test_client_credentials_token_is_a_service_principal(oidc_client, provider):
    bot = provider.ci_bot()
    r = submit(oidc_client, bot, "team-a")
    assert r.status_code == 202, r.text
    assert r.json()["user"] == "cibot"  # from service_users, not "service-account-ci-bot"
    assert submit(oidc_client, bot, "team-b").status_code == 403
    principal = oidc_client.app.state.authenticator.authenticate(bot)
    assert principal.kind == "service" and principal.accounts == {"team-a"}


def test_second_issuer_is_trusted_alongside_the_first(oidc_client, provider):
    erin = provider.password("erin", ci_realm=True)
    runner = provider.ci_runner()
    job = submit(oidc_client, runner, "team-b")
    assert job.status_code == 202, job.text
    assert job.json()["user"] == "runner"
    assert oidc_client.get(f"/v1/jobs/{job.json()['id']}", headers=bearer(erin)).status_code == 200
    assert submit(oidc_client, erin, "team-a").status_code == 403
    status = oidc_client.get("/readyz").json()
    assert status["status"] == "ok"
    assert status["identity"]["staff realm"]["ok"] and status["identity"]["ci realm"]["ok"]


def test_probes_and_openapi_stay_public(oidc_client):
    assert oidc_client.get("/healthz").status_code == 200
    assert oidc_client.get("/openapi.json").status_code == 200
    assert oidc_client.get("/readyz").status_code == 200
    r = oidc_client.get("/v1/jobs")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def test_token_for_another_audience_is_refused(oidc_client, provider, oidc_env):
    token = provider.password("alice", client_id=oidc_env["OIDC_OTHER_AUDIENCE_CLIENT_ID"])
    r = oidc_client.get("/v1/jobs", headers=bearer(token))
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
    assert r.json()["detail"].startswith("wrong audience: ")


def test_real_token_stops_working_after_its_exp(make_client, provider, oidc_env):
    client = make_client(issuers=issuer_configs(oidc_env, leeway_s=0))
    token = provider.password("alice", client_id=oidc_env["OIDC_SHORT_CLIENT_ID"])  # 5 s lifespan
    assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    time.sleep(6.5)
    r = client.get("/v1/jobs", headers=bearer(token))
    assert r.status_code == 401 and r.json()["detail"].startswith("token expired: ")


def test_id_token_is_not_an_access_token(oidc_client, provider, oidc_env):
    r = provider.http.post(oidc_env["OIDC_TOKEN_ENDPOINT"], data={
        "grant_type": "password", "client_id": "isthmus", "username": "alice",
        "password": "alice" + oidc_env["OIDC_PASSWORD_SUFFIX"], "scope": "openid"})
    id_token = r.json()["id_token"]  # signed by the same key, aud "isthmus" (the client)
    before = job_count(oidc_client)
    r = submit(oidc_client, id_token, "team-a")
    assert r.status_code == 401 and r.json()["detail"] == "not an access token"
    assert job_count(oidc_client) == before
