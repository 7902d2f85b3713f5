"""/docs and /redoc work with no internet: every asset comes from the gateway (#18, 3)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from gateway.app import create_app
from gateway.cli import run_migrations
from gateway.kit.settings import Settings
from tests.browser import browser, off_loopback, requested_urls, serving  # noqa: F401


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apidocs")
    url = f"sqlite:///{tmp}/gw.db"
    run_migrations(url)
    app = create_app(Settings(database_url=url, dev_mode=True, dev_key_path=tmp / "dev-key.pem"))
    with serving(app) as base:
        yield base


def operations() -> list[dict]:
    spec = json.loads(Path("docs/openapi.json").read_text())
    return [op for path in spec["paths"].values() for op in path.values()]


def test_docs_pages_reference_only_the_gateways_own_assets(gateway_url):
    for page in ("/docs", "/redoc"):
        html = httpx.get(gateway_url + page).text
        assert "cdn" not in html.lower() and "https://" not in html, html
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"):
        r = httpx.get(f"{gateway_url}/static/apidocs/{asset}")
        assert r.status_code == 200 and len(r.content) > 1000, asset
        assert b"cdn.redoc.ly" not in r.content, asset


def test_swagger_ui_renders_every_operation_without_leaving_loopback(gateway_url, browser):
    browser.get(gateway_url + "/docs")
    ops = operations()
    WebDriverWait(browser, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= len(ops))
    text = browser.find_element(By.TAG_NAME, "body").text
    assert "Isthmus" in text
    for op in ops:
        assert op["summary"] in text, op["summary"]
    urls = requested_urls(browser)
    assert any(u.endswith("/openapi.json") for u in urls), urls
    assert off_loopback(urls) == []


def test_redoc_renders_the_operations_without_leaving_loopback(gateway_url, browser):
    browser.get(gateway_url + "/redoc")
    WebDriverWait(browser, 60).until(
        lambda d: "Submit" in d.find_element(By.TAG_NAME, "body").text
        and len(d.find_elements(By.CSS_SELECTOR, "[data-section-id^='operation/']")) >= 10)
    text = browser.find_element(By.TAG_NAME, "body").text
    for op in operations()[:10]:
        assert op["summary"] in text, op["summary"]
    urls = requested_urls(browser)
    assert off_loopback(urls) == []
