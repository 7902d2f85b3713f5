"""A real headless Chromium (Debian's ``chromium`` + ``chromium-driver``) for browser tests.

Selenium is pointed at /usr/bin/chromedriver and /usr/bin/chromium so it never downloads a
browser (Selenium Manager is not consulted). Every request the page makes is read from
Chromium's performance log, so a test can prove that nothing left loopback; on top of that,
host resolution outside loopback is switched off, so a CDN reference fails loudly instead of
working by luck on a machine with internet.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = os.environ.get("ISTHMUS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ISTHMUS_CHROMEDRIVER", "/usr/bin/chromedriver")
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def require_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        reason = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
        if os.environ.get("ISTHMUS_REQUIRE_STACK") == "1":
            pytest.fail(reason + " (ISTHMUS_REQUIRE_STACK=1)")
        pytest.skip(reason)


def new_browser(width: int = 1280, height: int = 900):
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    return driver


def requested_urls(driver) -> list[str]:
    """Every URL the browser asked for since the last call (the log is drained when read)."""
    return [url for url, headers in network(driver) if headers is None]


def network(driver) -> list[tuple[str | None, dict | None]]:
    """Since the last call (the log is drained when read): (url, None) per request the browser
    made, (url, response headers with lower-case names) per response it received."""
    out: list[tuple[str | None, dict | None]] = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            out.append((msg["params"]["request"]["url"], None))
        elif msg.get("method") == "Network.responseReceived":
            response = msg["params"]["response"]
            out.append((response["url"], {k.lower(): v for k, v in response.get("headers", {}).items()}))
    return out


def off_loopback(urls: list[str]) -> list[str]:
    out = []
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in ("data", "blob", "about", "chrome", "chrome-extension"):
            continue
        if parts.hostname not in LOOPBACK:
            out.append(url)
    return out


@pytest.fixture
def browser() -> Iterator:
    driver = new_browser()
    try:
        yield driver
    finally:
        driver.quit()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app, port: int | None = None) -> Iterator[str]:
    """Run an ASGI app with uvicorn on loopback in a thread; yields its base URL."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test gateway did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
