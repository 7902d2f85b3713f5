"""Helpers shared by the browser tests of the dashboard (test_dashboard.py, test_dashboard_pools.py)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.identity.conftest import JOB

SHOTS = os.environ.get("ISTHMUS_UI_SCREENSHOTS")


def api(base: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def submit(base: str, token: str, **over) -> dict:
    r = api(base, token).post("/v1/jobs", json={**JOB, **over})
    assert r.status_code == 202, r.text
    return r.json()


def log_in(driver, base: str, user: str, env: dict, path: str = "/ui/") -> None:
    driver.get(base + path)
    WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.ID, "username"))
    assert driver.current_url.startswith(env["OIDC_ISSUER"])  # Keycloak's own page
    driver.find_element(By.ID, "username").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(user + env["OIDC_PASSWORD_SUFFIX"])
    driver.find_element(By.ID, "kc-login").click()
    WebDriverWait(driver, 30).until(lambda d: d.current_url.startswith(base + "/ui/") and d.find_elements(By.ID, "who"))
    assert driver.find_element(By.ID, "who").text == user


def live_text(driver, element_id: str) -> str:
    """The text of an element of a live job page as the page shows it now.

    The page replaces its live section whole at every refresh (gateway/ui/static/ui.js:
    on each of the job's events and every 2 s), so an element found a moment ago may be
    gone by the time its text is read: Chromium then answers with a stale reference, or
    with "Node with given id does not belong to the document" (CI, 2026-12-03). So the
    text is read in one script, inside the page, where no refresh can come between the
    lookup and the read. A missing element is a NoSuchElementException, which
    ``WebDriverWait`` ignores like a refresh in flight.
    """
    text = driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e === null ? null : e.innerText;", element_id)
    if text is None:
        raise NoSuchElementException(f"no element #{element_id} on the page")
    return text.strip()


def live_click(driver, element_id: str) -> None:
    """Click an element of a live job page (a button of its live section) as a user does.

    A refresh may replace the button between its lookup and the click; the click is then
    made again on the new button. Only the replaced-element errors are retried: a click
    that lands is never repeated (the form posts and the page moves on)."""
    for attempt in range(10):
        try:
            driver.find_element(By.ID, element_id).click()
            return
        except StaleElementReferenceException:
            continue
        except WebDriverException as e:
            if "does not belong to the document" not in str(e) or attempt == 9:
                raise


def shot(driver, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))
