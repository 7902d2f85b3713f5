"""The /ui dashboard in a real headless Chromium, logged in on the real Keycloak (#18, 2).

Jobs are submitted through the API with real Keycloak tokens; the browser logs in through
Keycloak's own login page (authorization code + PKCE, authlib's Starlette client). No pool
is configured here, so jobs stay pending; test_dashboard_pools.py runs them on the real
Slurm and Kueue pools. Set ISTHMUS_UI_SCREENSHOTS=docs/ui to refresh the screenshots shown
in the README; test_dashboard_pools.py, when it runs (after this file), makes My jobs, a
job, Accounts and Pools again with real pools and output.
"""

from __future__ import annotations

import json

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from gateway.app import create_app
from gateway.kit.settings import Settings
from tests.browser import network, new_browser, off_loopback, requested_urls, serving
from tests.identity.conftest import (  # noqa: F401
    _migrate_and_seed,
    issuer_configs,
    oidc_env,
    provider,
)
from tests.ui.conftest import api, live_click, live_text, log_in, shot, submit

pytestmark = pytest.mark.oidc

HOSTILE_NAME = "<script>window.__pwned=1</script>"
HOSTILE_ENV = "<img src=x onerror=window.__pwned=2>"


@pytest.fixture(scope="module")
def dashboard(oidc_env, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-gw")
    url = f"sqlite:///{tmp}/gw.db"
    _migrate_and_seed(url)
    app = create_app(Settings(database_url=url, oidc_issuers=json.dumps(issuer_configs(oidc_env)),
                              dev_key_path=tmp / "dev-key.pem", ui_oidc_issuer=oidc_env["OIDC_ISSUER"],
                              ui_client_id=oidc_env["OIDC_CLIENT_ID"], ui_session_secret="test-only-" + "x" * 32,
                              metrics_token="test-metrics-token"))
    with serving(app) as base:
        APPS[base] = app
        yield base


APPS: dict = {}  # the dashboard's app by base URL (to read its session table)


def csp_violations(driver, base: str) -> list[str]:
    """The browser console's Content-Security-Policy complaints about the dashboard's pages (drains the log)."""
    return [e["message"] for e in driver.get_log("browser")
            if "Content Security Policy" in e["message"] and base in e["message"]]


def is_jwt(value: str) -> bool:
    import base64

    parts = value.split(".")
    if len(parts) != 3:
        return False
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except ValueError:
        return False
    return isinstance(header, dict) and "alg" in header


def test_a_user_logs_in_sees_only_their_jobs_watches_one_and_cancels_it(dashboard, provider, oidc_env):
    alice, bob = provider.password("alice"), provider.password("bob")
    # Job names are validated ([A-Za-z0-9._-]); commands and env values are free text.
    hostile = submit(dashboard, alice, name="hostile", command=["echo", HOSTILE_NAME], env={"NOTE": HOSTILE_ENV})
    watched = submit(dashboard, alice, name="watched")
    other = submit(dashboard, bob, name="bobs-job", account="team-b")

    driver = new_browser()
    try:
        log_in(driver, dashboard, "alice", oidc_env)
        cookie = driver.get_cookie("isthmus_ui")
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Lax" and cookie["path"] == "/ui"

        rows = {r.get_attribute("data-job-id"): r for r in driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")}
        assert hostile["id"] in rows and watched["id"] in rows
        assert other["id"] not in rows and other["id"] not in driver.page_source  # tenancy
        # Hostile names render as text, and no script of theirs ran.
        assert rows[hostile["id"]].find_element(By.CLASS_NAME, "name").text == "hostile"
        shot(driver, "jobs")

        driver.get(f"{dashboard}/ui/jobs/{hostile['id']}")
        spec = driver.find_element(By.ID, "spec").text
        assert HOSTILE_ENV in spec and HOSTILE_NAME in spec  # shown as text
        assert not driver.find_elements(By.CSS_SELECTOR, "#spec img, #spec script")
        assert driver.execute_script("return window.__pwned") is None
        # Another account's job is not found, as in the API.
        r = httpx.get(f"{dashboard}/ui/jobs/{other['id']}", cookies={"isthmus_ui": cookie["value"]})
        assert r.status_code == 404

        # Watch a job change state on the page without reloading it (cancelled through the API).
        driver.get(f"{dashboard}/ui/jobs/{watched['id']}")
        assert live_text(driver, "state") == "pending"
        driver.execute_script("document.body.setAttribute('data-not-reloaded', '1')")
        assert api(dashboard, alice).post(f"/v1/jobs/{watched['id']}/cancel").status_code in (200, 202)
        WebDriverWait(driver, 20).until(lambda d: live_text(d, "state") == "cancelled")
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-not-reloaded") == "1"
        assert "cancelled" in live_text(driver, "events")

        # A form post without the session's CSRF token is refused; with it (the button) it works.
        forged = httpx.post(f"{dashboard}/ui/jobs/{hostile['id']}/cancel", data={"csrf": "guess"},
                            cookies={"isthmus_ui": cookie["value"]})
        assert forged.status_code == 403
        driver.get(f"{dashboard}/ui/jobs/{hostile['id']}")
        shot(driver, "job")
        live_click(driver, "cancel")
        WebDriverWait(driver, 20).until(lambda d: live_text(d, "state") == "cancelled")
        assert api(dashboard, alice).get(f"/v1/jobs/{hostile['id']}").json()["state"] == "cancelled"
        assert api(dashboard, bob).get(f"/v1/jobs/{other['id']}").json()["state"] == "pending"

        for page in ("accounts", "pools"):
            driver.get(f"{dashboard}/ui/{page}")
            WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.TAG_NAME, "h1"))
            shot(driver, page)
        driver.get(f"{dashboard}/ui/accounts")
        assert driver.find_elements(By.ID, "account-team-a") and not driver.find_elements(By.ID, "account-team-b")
        assert driver.find_elements(By.CSS_SELECTOR, "#account-team-a svg.plot polyline")
        # alice is no admin
        assert httpx.get(f"{dashboard}/ui/admin", cookies={"isthmus_ui": cookie["value"]}).status_code == 403
        assert off_loopback(requested_urls(driver)) == []
    finally:
        driver.quit()


def test_an_admin_sees_usage_per_account_and_pool_and_quotas(dashboard, provider, oidc_env):
    driver = new_browser()
    try:
        log_in(driver, dashboard, "root-admin", oidc_env, path="/ui/admin")
        assert driver.current_url.endswith("/ui/admin")
        quotas = driver.find_element(By.ID, "quotas").text
        assert "team-a" in quotas and "team-b" in quotas
        assert driver.find_elements(By.ID, "usage") and driver.find_elements(By.CSS_SELECTOR, "svg.plot")
        shot(driver, "admin")
        assert csp_violations(driver, dashboard) == []  # nothing on the admin page breaks the policy
        driver.find_element(By.CSS_SELECTOR, "form.who button").click()  # log out (a CSRF-protected form)
        WebDriverWait(driver, 20).until(lambda d: d.current_url.endswith("/ui/logged-out"))
        assert driver.get_cookie("isthmus_ui") is None
        driver.get(dashboard + "/ui/admin")  # the session is gone: back to the login
        WebDriverWait(driver, 20).until(lambda d: "/ui/login" in d.current_url or d.current_url.startswith(
            oidc_env["OIDC_ISSUER"]) or d.current_url.endswith("/ui/admin"))
        assert off_loopback(requested_urls(driver)) == []
    finally:
        driver.quit()


def test_without_a_session_every_page_sends_the_browser_to_log_in(dashboard):
    for path in ("/ui/", "/ui/accounts", "/ui/pools", "/ui/admin", "/ui/jobs/x"):
        r = httpx.get(dashboard + path)
        assert r.status_code == 303 and "/ui/login" in r.headers["location"], path
    assert "set-cookie" not in httpx.get(dashboard + "/healthz").headers  # the API never gets a cookie


def test_the_dashboard_works_under_its_strict_csp_and_logout_ends_the_server_side_session(
        dashboard, provider, oidc_env):
    """#27, 9 and 10, in the real browser on the real Keycloak."""
    import base64

    from gateway.models.ui import UiSession

    job = submit(dashboard, provider.password("alice"), name="csp")
    driver = new_browser()
    try:
        network(driver)  # drop what came before
        log_in(driver, dashboard, "alice", oidc_env)
        driver.get(f"{dashboard}/ui/jobs/{job['id']}")
        # ui.js runs under script-src 'self': it says why there is no output yet, and the page stays live.
        WebDriverWait(driver, 20).until(
            lambda d: "no output yet" in d.find_element(By.ID, "output-status").text)
        assert live_text(driver, "state") == "pending"
        for page in ("accounts", "pools", "no-such-page"):
            driver.get(f"{dashboard}/ui/{page}")
            WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.TAG_NAME, "h1"))
        assert csp_violations(driver, dashboard) == []
        pages = [(url, h) for url, h in network(driver) if h is not None and url.startswith(dashboard + "/ui/")]
        assert len(pages) >= 5
        for url, h in pages:
            assert "frame-ancestors 'none'" in h.get("content-security-policy", ""), url
            assert "'unsafe-inline'" not in h["content-security-policy"], url
            assert h.get("x-frame-options") == "DENY" and h.get("referrer-policy") == "no-referrer", url
            assert h.get("x-content-type-options") == "nosniff", url

        # The cookie holds a session id only: not the token, not a JWT.
        cookie = driver.get_cookie("isthmus_ui")["value"]
        with APPS[dashboard].state.sessionmaker() as s:
            tokens = [row.access_token for row in s.query(UiSession)]
        assert tokens and all(t not in cookie for t in tokens)
        payload = json.loads(base64.b64decode(cookie.split(".")[0]))
        assert list(payload) == ["sid"] and not is_jwt(cookie) and not is_jwt(payload["sid"])
        assert all(payload["sid"] not in t and t not in json.dumps(payload) for t in tokens)

        # Logging out ends the session on the server: the old cookie, replayed, gets the login.
        assert httpx.get(f"{dashboard}/ui/", cookies={"isthmus_ui": cookie}).status_code == 200
        driver.get(f"{dashboard}/ui/")
        driver.find_element(By.CSS_SELECTOR, "form.who button").click()
        WebDriverWait(driver, 20).until(lambda d: d.current_url.endswith("/ui/logged-out"))
        replay = httpx.get(f"{dashboard}/ui/", cookies={"isthmus_ui": cookie})
        assert replay.status_code == 303 and "/ui/login" in replay.headers["location"]
        replay = httpx.get(f"{dashboard}/ui/events", cookies={"isthmus_ui": cookie})
        assert replay.status_code == 303 and "/ui/login" in replay.headers["location"]
    finally:
        driver.quit()
