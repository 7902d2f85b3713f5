"""`isthmus login` against the real Keycloak, approved in a real headless Chromium (#18, 1).

The device code (RFC 8628) is approved on Keycloak's own pages; the browser flow (code +
PKCE, loopback redirect) is completed by Chromium following Keycloak's redirect to the CLI's
one-shot server. Then the CLI's cached token calls /v1/me on a gateway trusting Keycloak.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from gateway.app import create_app
from gateway.kit.settings import Settings
from tests.browser import browser, serving  # noqa: F401
from tests.identity.conftest import _migrate_and_seed, issuer_configs

pytestmark = pytest.mark.oidc

ISTHMUS = str(Path(sys.executable).parent / "isthmus")


@pytest.fixture(scope="module")
def keycloak_gateway(oidc_env, tmp_path_factory):
    """A gateway process-local uvicorn trusting the stack's Keycloak realms."""
    tmp = tmp_path_factory.mktemp("login-gw")
    url = f"sqlite:///{tmp}/gw.db"
    _migrate_and_seed(url)
    app = create_app(Settings(database_url=url, oidc_issuers=json.dumps(issuer_configs(oidc_env)),
                              dev_key_path=tmp / "dev-key.pem", metrics_token="test-metrics-token"))
    with serving(app) as base:
        yield base


@pytest.fixture(scope="module")
def device_grant_enabled(provider):
    """The realm file enables the device grant on client `isthmus`; a Keycloak started from an
    older realm import gets it through the admin API (additive: one client attribute)."""
    admin = provider.admin_api()
    client = admin.get("/isthmus/clients", params={"clientId": provider.env["OIDC_CLIENT_ID"]}).json()[0]
    if client.get("attributes", {}).get("oauth2.device.authorization.grant.enabled") != "true":
        client.setdefault("attributes", {})["oauth2.device.authorization.grant.enabled"] = "true"
        assert admin.put(f"/isthmus/clients/{client['id']}", json=client).status_code == 204


def cli(config: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "ISTHMUS_CONFIG_DIR": str(config)}
    env.pop("ISTHMUS_TOKEN", None)
    return subprocess.run([ISTHMUS, *args], env=env, capture_output=True, text=True, timeout=120, **kw)


def start_login(config: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """Run `isthmus login ...` and return it with the first URL it prints."""
    env = {**os.environ, "ISTHMUS_CONFIG_DIR": str(config)}
    proc = subprocess.Popen([ISTHMUS, "login", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"(http://\S+)", line)
        if m:
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"login printed no URL: {proc.stderr.read()}")


def keycloak_sign_in(driver, user: str, password: str) -> None:
    WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.ID, "username"))
    driver.find_element(By.ID, "username").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.ID, "kc-login").click()


def test_device_code_approved_in_the_browser_then_whoami_uses_the_cached_token(
        oidc_env, device_grant_enabled, keycloak_gateway, browser, tmp_path):
    config = tmp_path / "cfg"
    proc, url = start_login(config, "--issuer", oidc_env["OIDC_ISSUER"], "--device")
    assert "/device" in url
    browser.get(url)
    keycloak_sign_in(browser, "alice", "alice" + oidc_env["OIDC_PASSWORD_SUFFIX"])
    # Keycloak asks to confirm the grant for the device (its consent page), then says done.
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.NAME, "accept")
                                     or "success" in d.page_source.lower())
    if browser.find_elements(By.NAME, "accept"):
        browser.find_element(By.NAME, "accept").click()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Logged in to " + oidc_env["OIDC_ISSUER"] in out

    cache = config / "tokens.json"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o700
    entry = json.loads(cache.read_text())["issuers"][oidc_env["OIDC_ISSUER"]]
    assert entry["token"]["refresh_token"]

    me = cli(config, "whoami", "--url", keycloak_gateway, "--json")
    assert me.returncode == 0, me.stderr
    assert json.loads(me.stdout)["user"] == "alice"
    assert entry["token"]["access_token"] not in me.stdout + me.stderr  # never printed


def test_an_expired_token_is_refreshed_with_the_refresh_token(oidc_env, device_grant_enabled, keycloak_gateway,
                                                             browser, tmp_path):
    config = tmp_path / "cfg"
    proc, url = start_login(config, "--issuer", oidc_env["OIDC_ISSUER"], "--browser", "--no-open")
    browser.get(url)
    keycloak_sign_in(browser, "bob", "bob" + oidc_env["OIDC_PASSWORD_SUFFIX"])
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    WebDriverWait(browser, 10).until(lambda d: "Logged in" in d.page_source)

    cache = config / "tokens.json"
    data = json.loads(cache.read_text())
    old = data["issuers"][oidc_env["OIDC_ISSUER"]]["token"]["access_token"]
    data["issuers"][oidc_env["OIDC_ISSUER"]]["token"]["expires_at"] = 0  # as if an hour went by
    cache.write_text(json.dumps(data))

    me = cli(config, "whoami", "--url", keycloak_gateway, "--json")
    assert me.returncode == 0, me.stderr
    assert json.loads(me.stdout)["user"] == "bob"
    fresh = json.loads(cache.read_text())["issuers"][oidc_env["OIDC_ISSUER"]]["token"]
    assert fresh["access_token"] != old and fresh["expires_at"] > time.time()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600

    gone = cli(config, "logout")
    assert gone.returncode == 0 and oidc_env["OIDC_ISSUER"] in gone.stdout
    assert json.loads(cache.read_text())["issuers"] == {}
    after = cli(config, "whoami", "--url", keycloak_gateway)
    assert after.returncode != 0 and "401" in after.stderr
