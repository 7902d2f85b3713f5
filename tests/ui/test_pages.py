"""/ui pages in-process (no browser): tenancy, escaping, CSRF, cookie flags (#18, 2).

The browser tests (test_dashboard.py) log in through Keycloak; here a session is made the
way the login callback makes it (a signed cookie holding an access token), with tokens of
the development issuer, so these run on SQLite and Postgres without the IdP.
"""

from __future__ import annotations

import json
from base64 import b64encode

import itsdangerous
import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.cli import run_migrations
from gateway.identity.dev import DevIssuer
from gateway.kit.settings import Settings
from gateway.ui.session import COOKIE

SECRET = "test-only-" + "s" * 32
HOSTILE = "<script>window.__pwned=1</script>"


@pytest.fixture
def ui(tmp_path):
    url = f"sqlite:///{tmp_path}/gw.db"
    run_migrations(url)
    settings = Settings(database_url=url, dev_mode=True, dev_key_path=tmp_path / "k.pem",
                        ui_session_secret=SECRET)
    with TestClient(create_app(settings)) as client:
        issuer = DevIssuer(issuer=settings.dev_issuer, audience=settings.audience, key_path=settings.dev_key_path)
        client.mint = lambda user, groups, admin=False: issuer.mint(user=user, groups=list(groups), admin=admin)
        yield client


def session_cookie(token: str, csrf: str = "the-csrf") -> str:
    signer = itsdangerous.TimestampSigner(SECRET, salt="isthmus-ui-session")
    return signer.sign(b64encode(json.dumps({"access_token": token, "csrf": csrf}).encode())).decode()


def submit(ui, token, **over) -> dict:
    spec = {"name": "j", "account": "team-a", "command": ["echo", HOSTILE], "workers": 1, "gpus_per_worker": 1,
            "env": {"NOTE": HOSTILE}, **over}
    r = ui.post("/v1/jobs", json=spec, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 202, r.text
    return r.json()


def test_pages_show_only_the_callers_jobs_and_escape_what_users_typed(ui):
    alice, bob = ui.mint("alice", ["team-a"]), ui.mint("bob", ["team-b"])
    mine = submit(ui, alice, name="mine")
    theirs = submit(ui, bob, name="theirs", account="team-b")
    ui.cookies.set(COOKIE, session_cookie(alice), path="/ui")
    page = ui.get("/ui/")
    assert page.status_code == 200 and mine["id"] in page.text and theirs["id"] not in page.text
    job = ui.get(f"/ui/jobs/{mine['id']}")
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in job.text and HOSTILE not in job.text
    assert ui.get(f"/ui/jobs/{theirs['id']}").status_code == 404
    for path in ("/ui/accounts", "/ui/pools"):
        assert ui.get(path).status_code == 200, path
    assert "team-b" not in ui.get("/ui/accounts").text
    assert ui.get("/ui/admin").status_code == 403


def test_cancel_needs_the_sessions_csrf_token(ui):
    alice = ui.mint("alice", ["team-a"])
    job = submit(ui, alice)
    ui.cookies.set(COOKIE, session_cookie(alice, csrf="right"), path="/ui")
    for forged in ({}, {"csrf": "wrong"}):
        assert ui.post(f"/ui/jobs/{job['id']}/cancel", data=forged, follow_redirects=False).status_code == 403
    assert ui.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": "right"},
                   headers={"Origin": "https://evil.example"}, follow_redirects=False).status_code == 403
    headers = {"Authorization": f"Bearer {alice}"}
    assert ui.get(f"/v1/jobs/{job['id']}", headers=headers).json()["state"] == "pending"
    r = ui.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": "right"}, follow_redirects=False)
    assert r.status_code == 303
    assert ui.get(f"/v1/jobs/{job['id']}", headers=headers).json()["state"] == "cancelled"


def test_admin_page_shows_quotas_and_usage(ui):
    ui.cookies.set(COOKIE, session_cookie(ui.mint("root", ["team-a"], admin=True)), path="/ui")
    page = ui.get("/ui/admin")
    assert page.status_code == 200 and 'id="quotas"' in page.text and "team-b" in page.text


def test_without_a_session_pages_redirect_to_login_and_a_bad_cookie_is_ignored(ui):
    ui.cookies.set(COOKIE, "forged.value.sig", path="/ui")
    r = ui.get("/ui/accounts", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("/ui/login?next=%2Fui%2Faccounts")
    # No issuer configured for /ui: the login page says so instead of failing.
    assert ui.get("/ui/login").status_code == 503


def test_the_session_cookie_is_httponly_lax_and_secure_under_tls(tmp_path):
    url = f"sqlite:///{tmp_path}/gw.db"
    run_migrations(url)
    app = create_app(Settings(database_url=url, dev_mode=True, dev_key_path=tmp_path / "k.pem",
                              ui_session_secret=SECRET))
    for base, secure in (("http://testserver", False), ("https://testserver", True)):
        with TestClient(app, base_url=base) as client:
            issuer = DevIssuer(issuer="urn:isthmus:dev-issuer", audience="isthmus", key_path=tmp_path / "k.pem")
            client.cookies.set(COOKIE, session_cookie(issuer.mint(user="alice", groups=["team-a"])), path="/ui")
            r = client.get("/ui/")
            cookie = r.headers["set-cookie"].lower()
            assert "httponly" in cookie and "samesite=lax" in cookie and "path=/ui" in cookie
            assert ("; secure" in cookie) is secure
            assert "set-cookie" not in client.get("/healthz").headers


def test_outside_dev_mode_a_ui_issuer_needs_a_session_secret(tmp_path):
    from gateway.identity.setup import ConfigurationError

    with pytest.raises(ConfigurationError, match="ISTHMUS_UI_SESSION_SECRET"):
        create_app(Settings(database_url=f"sqlite:///{tmp_path}/x.db", dev_mode=False,
                            oidc_issuers=json.dumps([{"issuer": "https://sso.example/realms/x",
                                                      "jwks_uri": "https://sso.example/certs"}]),
                            ui_oidc_issuer="https://sso.example/realms/x"))
