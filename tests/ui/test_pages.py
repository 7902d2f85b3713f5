"""/ui pages in-process (no browser): tenancy, escaping, CSRF, cookie flags (#18, 2).

The browser tests (test_dashboard.py) log in through Keycloak; here a session is made the
way the login callback makes it (a server-side row holding an access token, a signed cookie
holding its id), with tokens of the development issuer, so these run without the IdP.
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


def session_cookie(app, token: str, csrf: str = "the-csrf") -> str:
    """A logged-in session as the login callback makes it: a server-side row, a cookie with its id."""
    from sqlalchemy import update

    from gateway.identity import ui_sessions
    from gateway.kit.db import transaction
    from gateway.models.ui import UiSession

    app = getattr(app, "app", app)
    with transaction(app.state.sessionmaker) as s:
        sid = ui_sessions.create(s, access_token=token, subject=app.state.authenticator.authenticate(token).subject,
                                 token_expires_at=None)
        s.execute(update(UiSession).where(UiSession.id_hash == ui_sessions.hash_id(sid)).values(csrf=csrf))
    return sign({"sid": sid})


def page_as(gw, headers: dict, path: str) -> str:
    """A /ui page as the holder of ``headers``' token sees it, through a wired gateway's
    client (a session made as the login makes one); asserts it is served."""
    from gateway.ui.session import COOKIE

    gw.client.cookies.set(COOKIE, session_cookie(gw.app, headers["Authorization"].split()[1]))
    try:
        r = gw.client.get(path)
    finally:
        gw.client.cookies.clear()
    assert r.status_code == 200, r.text
    return r.text


def sign(data: dict) -> str:
    signer = itsdangerous.TimestampSigner(SECRET, salt="isthmus-ui-session")
    return signer.sign(b64encode(json.dumps(data).encode())).decode()


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
    ui.cookies.set(COOKIE, session_cookie(ui, alice), path="/ui")
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
    ui.cookies.set(COOKIE, session_cookie(ui, alice, csrf="right"), path="/ui")
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
    ui.cookies.set(COOKIE, session_cookie(ui, ui.mint("root", ["team-a"], admin=True)), path="/ui")
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
            client.cookies.set(COOKIE, session_cookie(app, issuer.mint(user="alice", groups=["team-a"])), path="/ui")
            r = client.get("/ui/")
            cookie = r.headers["set-cookie"].lower()
            assert "httponly" in cookie and "samesite=lax" in cookie and "path=/ui" in cookie
            assert ("; secure" in cookie) is secure
            assert "set-cookie" not in client.get("/healthz").headers


def test_outside_dev_mode_a_ui_issuer_needs_a_session_secret(tmp_path):
    from gateway.identity.setup import ConfigurationError

    with pytest.raises(ConfigurationError, match="ISTHMUS_UI_SESSION_SECRET"):
        create_app(Settings(database_url=f"sqlite:///{tmp_path}/x.db", dev_mode=False, metrics_token="t",
                            oidc_issuers=json.dumps([{"issuer": "https://sso.example/realms/x",
                                                      "jwks_uri": "https://sso.example/certs"}]),
                            ui_oidc_issuer="https://sso.example/realms/x"))


def _set_estimate(ui, job_id: str, *, start, pool, reason) -> None:
    from gateway.jobs import claims as jobs
    from gateway.kit.db import transaction
    from gateway.models.jobs import Job

    with transaction(ui.app.state.sessionmaker) as session:
        jobs.note_estimate(session.get(Job, job_id), start=start, pool=pool, reason=reason)


def test_a_pending_job_shows_why_it_waits_and_its_estimated_start_or_why_there_is_none(ui):
    from datetime import timedelta

    from gateway.kit.timeutil import utcnow

    alice = ui.mint("alice", ["team-a"])
    planned, held, unseen = (submit(ui, alice, name=n) for n in ("planned", "held", "unseen"))
    start = (utcnow() + timedelta(minutes=12)).replace(microsecond=0)
    _set_estimate(ui, planned["id"], start=start, pool="slurm",
                  reason=f"reserved on slurm: planned start {start.isoformat()}")
    _set_estimate(ui, held["id"], start=None, pool=None, reason="held: team-a is at its GPU quota")
    ui.cookies.set(COOKIE, session_cookie(ui, alice), path="/ui")

    page = ui.get("/ui/").text
    rows = {j["id"]: page[page.index(f'data-job-id="{j["id"]}"'):].split("</tr>")[0]
            for j in (planned, held, unseen)}
    at = start.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert at in rows[planned["id"]] and "on slurm" in rows[planned["id"]]
    assert "in 12 min" in rows[planned["id"]] or "in 11 min" in rows[planned["id"]]
    assert "none: held: team-a is at its GPU quota" in rows[held["id"]]
    assert "not estimated yet" in rows[unseen["id"]]

    job = ui.get(f"/ui/jobs/{planned['id']}").text
    estimate = job[job.index('id="estimate"'):].split("</p>")[0]
    assert at in estimate and "<b>slurm</b>" in estimate and "reserved on slurm: planned start" in estimate
    held_page = ui.get(f"/ui/jobs/{held['id']}").text
    assert "none." in held_page and "held: team-a is at its GPU quota" in held_page
    # Once the job has left pending, the estimate no longer applies and is not shown (as in the API).
    ui.post(f"/v1/jobs/{planned['id']}/cancel", headers={"Authorization": f"Bearer {alice}"})
    assert 'id="estimate"' not in ui.get(f"/ui/jobs/{planned['id']}").text


def test_errors_under_ui_are_html_pages_and_the_api_keeps_problem_json(ui):
    alice, bob = ui.mint("alice", ["team-a"]), ui.mint("bob", ["team-b"])
    theirs = submit(ui, bob, name="theirs", account="team-b")
    ui.cookies.set(COOKIE, session_cookie(ui, alice), path="/ui")
    for path, status, words in ((f"/ui/jobs/{theirs['id']}", 404, "Not found"),
                                ("/ui/no-such-page", 404, "Not Found"),
                                ("/ui/admin", 403, "the admin page needs the admin role"),
                                ("/ui/admin?days=many", 422, "query.days")):
        r = ui.get(path)
        assert r.status_code == status, (path, r.text)
        assert r.headers["content-type"].startswith("text/html"), path
        assert f'data-status="{status}"' in r.text and words in r.text, path
        assert '<link rel="stylesheet" href="/ui/static/ui.css">' in r.text and 'id="who"' in r.text, path
        assert "theirs" not in r.text and "team-b" not in r.text  # nothing of bob's job
    # Not logged in: still a page, offering to log in (a GET of a page sends the browser to log in first).
    ui.cookies.clear()
    r = ui.get("/ui/static/missing.css")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html") and "/ui/login" in r.text
    r = ui.post("/ui/jobs/x/cancel", data={"csrf": "x"}, follow_redirects=False)
    assert r.status_code == 303  # to the login, then back to /ui/
    # The API's errors stay RFC 9457 problem+json.
    headers = {"Authorization": f"Bearer {alice}"}
    for path in (f"/v1/jobs/{theirs['id']}", "/v1/no-such-route"):
        r = ui.get(path, headers=headers)
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json", path


def test_an_unexpected_error_under_ui_is_an_html_page_that_leaks_nothing(tmp_path):
    url = f"sqlite:///{tmp_path}/gw.db"
    run_migrations(url)
    app = create_app(Settings(database_url=url, dev_mode=True, dev_key_path=tmp_path / "k.pem",
                              ui_session_secret=SECRET))

    def boom():
        raise RuntimeError("secret internals: password=hunter2")

    app.add_api_route("/ui/boom", boom)
    app.add_api_route("/v1/boom", boom)
    with TestClient(app, raise_server_exceptions=False) as client:
        page = client.get("/ui/boom")
        assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
        assert 'data-status="500"' in page.text and "has been logged" in page.text and "hunter2" not in page.text
        api = client.get("/v1/boom")
        assert api.status_code == 500 and api.headers["content-type"] == "application/problem+json"
        assert "hunter2" not in api.text


def test_the_job_page_reads_output_through_the_session_only_for_the_jobs_account(ui, tmp_path):
    alice, bob = ui.mint("alice", ["team-a"]), ui.mint("bob", ["team-b"])
    job = submit(ui, alice, name="out")
    ui.cookies.set(COOKIE, session_cookie(ui, alice), path="/ui")
    page = ui.get(f"/ui/jobs/{job['id']}").text
    assert f'data-output-url="/ui/jobs/{job["id"]}/output"' in page
    # Pending and not routed: the reason, as text, with the API's status.
    r = ui.get(f"/ui/jobs/{job['id']}/output")
    assert r.status_code == 409 and r.headers["content-type"].startswith("text/plain")
    assert "no output yet" in r.text and r.headers["x-content-type-options"] == "nosniff"
    assert ui.get(f"/ui/jobs/{job['id']}/output", params={"worker": -1}).status_code == 422
    ui.cookies.clear()
    ui.cookies.set(COOKIE, session_cookie(ui, bob), path="/ui")
    r = ui.get(f"/ui/jobs/{job['id']}/output")
    assert r.status_code == 404 and "visible to you" in r.text and "no output yet" not in r.text


def _sse_data(url: str, cookie: str, *, n: int, headers: dict | None = None) -> list[dict]:
    """The first ``n`` events' data of a /ui/events stream (read over real HTTP: it stays open)."""
    import httpx

    out: list[dict] = []
    with httpx.stream("GET", url + "/ui/events", params={"after": 0}, cookies={COOKIE: cookie},
                      headers=headers or {}, timeout=httpx.Timeout(10, read=10)) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
            if len(out) >= n:
                break
    return out


def test_the_sessions_event_stream_carries_only_the_callers_jobs(ui):
    from tests.jobs.live import served

    alice, bob = ui.mint("alice", ["team-a"]), ui.mint("bob", ["team-b"])
    theirs = submit(ui, bob, name="theirs", account="team-b")
    mine = submit(ui, alice, name="mine")
    ui.post(f"/v1/jobs/{mine['id']}/cancel", headers={"Authorization": f"Bearer {alice}"})
    assert ui.get("/ui/events", follow_redirects=False).status_code == 303  # no session: log in
    with served(ui.app) as url:
        data = _sse_data(url, session_cookie(ui, alice), n=2)
        assert [(d["job_id"], d["to_state"]) for d in data] == [(mine["id"], "pending"), (mine["id"], "cancelled")]
        # bob's job came first: had the stream carried it, it would be among the first two.
        assert theirs["id"] not in {d["job_id"] for d in data}
    ui.cookies.set(COOKIE, session_cookie(ui, alice), path="/ui")
    bad = ui.get("/ui/events", headers={"Last-Event-ID": "x"})
    assert bad.status_code == 422 and "header.Last-Event-ID" in bad.text


def test_the_sessions_event_streams_count_with_the_callers_api_streams(ui):
    """/ui/events is one of the caller's open streams (#27, 4): beyond the limit, a 429 page."""
    import httpx

    from tests.jobs.live import served
    from tests.jobs.test_events_stream import OpenStream

    alice = ui.mint("alice", ["team-a"])
    cookie = session_cookie(ui, alice)
    with served(ui.app) as url:
        held = [OpenStream(url, alice) for _ in range(9)]
        try:
            assert [s.status for s in held] == [200] * 9
            with httpx.stream("GET", url + "/ui/events", cookies={COOKIE: cookie},
                              timeout=httpx.Timeout(10, read=10)) as tenth:
                assert tenth.status_code == 200
                lines = tenth.iter_lines()  # kept: dropping it would close the stream
                assert next(lines) == "retry: 2000"
                eleventh = httpx.get(url + "/ui/events", cookies={COOKIE: cookie}, timeout=10)
                assert eleventh.status_code == 429 and "ISTHMUS_MAX_STREAMS_PER_SUBJECT" in eleventh.text
            # The dashboard's stream closed: its place is free again.
            held.append(OpenStream(url, alice))
            assert held[-1].status == 200
        finally:
            for s in held:
                if s.status == 200:
                    s.close()


def test_logout_ends_the_session_on_the_server_and_a_replayed_cookie_gets_the_login(ui):
    """#27, 9: logging out revokes the server-side session; the old cookie value is worth nothing."""
    from gateway.models.ui import UiSession

    alice = ui.mint("alice", ["team-a"])
    cookie = session_cookie(ui, alice, csrf="right")
    ui.cookies.set(COOKIE, cookie, path="/ui")
    assert ui.get("/ui/").status_code == 200
    out = ui.post("/ui/logout", data={"csrf": "right"}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/ui/logged-out"
    ui.cookies.clear()
    ui.cookies.set(COOKIE, cookie, path="/ui")  # the value the browser had, replayed
    for path in ("/ui/", "/ui/accounts", "/ui/events"):
        r = ui.get(path, follow_redirects=False)
        assert r.status_code == 303 and "/ui/login" in r.headers["location"], path
    with ui.app.state.sessionmaker() as s:
        assert s.query(UiSession).count() == 0  # the row is gone, not just the browser's cookie
    r = ui.post("/ui/logout", data={"csrf": "right"}, follow_redirects=False)  # nothing left to end
    assert r.status_code == 303


def test_an_expired_session_row_is_refused_and_purged_at_the_next_login(ui):
    from datetime import timedelta

    from sqlalchemy import update

    from gateway.kit.db import transaction
    from gateway.kit.timeutil import utcnow
    from gateway.models.ui import UiSession

    alice = ui.mint("alice", ["team-a"])
    ui.cookies.set(COOKIE, session_cookie(ui, alice), path="/ui")
    assert ui.get("/ui/").status_code == 200
    with transaction(ui.app.state.sessionmaker) as s:
        s.execute(update(UiSession).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert ui.get("/ui/", follow_redirects=False).status_code == 303
    session_cookie(ui, alice)  # the next login purges expired rows
    with ui.app.state.sessionmaker() as s:
        assert s.query(UiSession).count() == 1
    # A session ends with its token too: the row goes with it.
    settings = ui.app.state.settings
    issuer = DevIssuer(issuer=settings.dev_issuer, audience=settings.audience, key_path=settings.dev_key_path)
    short = issuer.mint(user="alice", groups=["team-a"], lifetime_s=2)
    ui.cookies.set(COOKIE, session_cookie(ui, short), path="/ui")
    with transaction(ui.app.state.sessionmaker) as s:  # as if the token had expired since
        s.execute(update(UiSession).values(access_token=issuer.mint(user="alice", groups=["team-a"],
                                                                    lifetime_s=-120)))
    assert ui.get("/ui/", follow_redirects=False).status_code == 303
    with ui.app.state.sessionmaker() as s:
        assert s.query(UiSession).count() == 1  # of 2: the other login's row stays


PHISH = "Your account is locked: call +1-555-0100 and give your password"


def test_a_failed_login_shows_a_fixed_message_never_the_providers_text(tmp_path, caplog):
    """#27, 10: error_description comes from the query string anyone can craft; it goes to the log only."""
    url = f"sqlite:///{tmp_path}/gw.db"
    run_migrations(url)
    app = create_app(Settings(database_url=url, dev_mode=True, dev_key_path=tmp_path / "k.pem",
                              ui_session_secret=SECRET, ui_oidc_issuer="https://sso.example/realms/x"))
    with TestClient(app) as client, caplog.at_level("WARNING", logger="isthmus.ui"):
        r = client.get("/ui/auth/callback", params={"error": "access_denied", "error_description": PHISH})
    assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
    assert "The login did not complete" in r.text
    assert "555-0100" not in r.text and "access_denied" not in r.text
    assert any("555-0100" in rec.getMessage() for rec in caplog.records)  # for the operator


def test_every_ui_answer_carries_a_strict_csp_and_no_framing(ui):
    alice = ui.mint("alice", ["team-a"])
    job = submit(ui, alice)
    ui.cookies.set(COOKIE, session_cookie(ui, alice), path="/ui")
    for path in ("/ui/", f"/ui/jobs/{job['id']}", f"/ui/jobs/{job['id']}/output", "/ui/static/ui.js",
                 "/ui/no-such-page", "/ui/logged-out"):
        r = ui.get(path, follow_redirects=False)
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "'unsafe-inline'" not in csp, path
        assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "no-referrer", path
        assert r.headers["x-content-type-options"] == "nosniff", path
    # The templates need nothing the policy forbids: no inline script, style or handler.
    import re

    from gateway.ui.router import HERE

    for template in (HERE / "templates").glob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)|<style|\sstyle=|\son[a-z]+=", text), template.name
    assert "content-security-policy" not in ui.get("/healthz").headers  # the API is not a page


def test_a_ui_visit_records_the_accounts_its_caller_holds(ui):
    # A person who only uses /ui must keep their webhooks alive like an API caller (issue #27,
    # finding 6: an endpoint whose holder is not seen with the account is suspended).
    from sqlalchemy import select

    from gateway.models.identity import MembershipSeen

    token = ui.mint("alice", ["team-a"])
    ui.cookies.set(COOKIE, session_cookie(ui, token), path="/ui")
    assert ui.get("/ui/").status_code == 200
    with ui.app.state.sessionmaker() as s:
        seen = set(s.scalars(select(MembershipSeen.account).where(MembershipSeen.subject == "dev:alice")))
    assert "team-a" in seen, seen


def test_admins_add_and_delete_maintenance_windows_from_the_admin_page(ui):
    """The admin page's window form goes through the same rule as the API (issue #31); the
    pools page shows every user the windows; the form needs the admin role and the CSRF token."""
    from gateway.kit.db import transaction
    from gateway.models.pools import Pool

    with transaction(ui.app.state.sessionmaker) as s:
        s.add(Pool(name="slurm-ui", kind="slurm", gpu_types=[], configured=True))
    form = {"pool": "slurm-ui", "start": "2030-01-08T06:00", "end": "2030-01-08T10:00",
            "reason": "kernel " + HOSTILE, "nodes": "gpu-1, gpu-2"}
    ui.cookies.clear()
    ui.cookies.set(COOKIE, session_cookie(ui, ui.mint("alice", ["team-a"]), csrf="a-csrf"), path="/ui")
    assert ui.post("/ui/admin/windows", data={**form, "csrf": "a-csrf"}, follow_redirects=False).status_code == 403
    ui.cookies.clear()
    ui.cookies.set(COOKIE, session_cookie(ui, ui.mint("root", ["team-a"], admin=True), csrf="right"), path="/ui")
    assert ui.post("/ui/admin/windows", data={**form, "csrf": "wrong"}, follow_redirects=False).status_code == 403
    bad = ui.post("/ui/admin/windows", data={**form, "end": "2030-01-08T05:00", "csrf": "right"})
    assert bad.status_code == 422 and "must be after start" in bad.text
    r = ui.post("/ui/admin/windows", data={**form, "csrf": "right"}, follow_redirects=False)
    assert r.status_code == 303
    admin_page = ui.get("/ui/admin").text
    assert "2030-01-08 06:00 UTC" in admin_page and "gpu-1, gpu-2" in admin_page
    assert HOSTILE not in admin_page and "&lt;script&gt;" in admin_page  # the reason is escaped
    ui.cookies.clear()
    ui.cookies.set(COOKIE, session_cookie(ui, ui.mint("alice", ["team-a"])), path="/ui")
    pools_page = ui.get("/ui/pools").text
    assert "2030-01-08 06:00 UTC – 2030-01-08 10:00 UTC" in pools_page and HOSTILE not in pools_page
    ui.cookies.clear()
    ui.cookies.set(COOKIE, session_cookie(ui, ui.mint("root", ["team-a"], admin=True), csrf="right"), path="/ui")
    [window_id] = __import__("re").findall(r'/ui/admin/windows/slurm-ui/([0-9a-f-]{36})/delete', admin_page)
    assert ui.post(f"/ui/admin/windows/slurm-ui/{window_id}/delete", data={"csrf": "right"},
                   follow_redirects=False).status_code == 303
    assert "No window on any pool." in ui.get("/ui/admin").text
    # An advance reservation is listed on the same page, flagged when its pool cannot be checked.
    admin = {"Authorization": f"Bearer {ui.mint('root', ['team-a'], admin=True)}"}
    r = ui.post("/v1/admin/reservations", headers=admin, json={
        "account": "team-a", "pool": "slurm-ui", "gpus": 16, "start": "2030-01-09T00:00:00Z",
        "end": "2030-01-10T00:00:00Z", "reason": "deadline"})
    assert r.status_code == 201, r.text
    page = ui.get("/ui/admin").text
    assert "16 GPUs of slurm-ui are reserved for team-a from Wed 9 Jan 00:00 to Thu 10 Jan 00:00 UTC (deadline)" in page
    assert "no: slurm-ui does not answer" in page
