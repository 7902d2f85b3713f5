"""/ui/accounts/{name}/statement (issue #49, item 3): an account's coordinators read its
statement in the dashboard and download it as CSV; others get the not-found page. In-process,
with a session made as the login makes one (tests/ui/test_pages.py)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gateway.domain.prices import PriceList
from gateway.kit.db import transaction
from gateway.ledger import service as ledger
from gateway.ui.session import COOKIE
from tests.ledger.dbfixtures import add_job
from tests.ui.test_pages import session_cookie, ui  # noqa: F401 - the fixture

T = datetime(2026, 11, 3, 8, 0, tzinfo=UTC)
MONTH = "since=2026-11-01&until=2026-12-01"


def _history(ui):
    admin = {"Authorization": f"Bearer {ui.mint('root', [], admin=True)}"}
    for body in ({"name": "lab"}, {"name": "lab-a", "parent": "lab"}, {"name": "lab-b", "parent": "lab"}):
        assert ui.post("/v1/admin/accounts", json=body, headers=admin).status_code == 201
    assert ui.put("/v1/admin/accounts/lab-a/members/carol", json={"role": "coordinator"},
                  headers=admin).status_code == 200
    ui.app.state.prices = PriceList(currency="EUR", pools={"slurm": {"default": Decimal(3)}})
    with transaction(ui.app.state.sessionmaker) as s:
        job = add_job(s, "lab-a", gpus=2, time_limit_s=4 * 3600)
        ledger.reserve(s, job=job, pool="slurm", actor="t", now=T)
        ledger.record_start(s, job=job, started_at=T, actor="t")
        ledger.record_finish(s, job=job, started_at=T, ended_at=T + timedelta(minutes=90), actor="t",
                             half_life_s=7 * 86400)
    return job


def _as(ui, user, groups=()):
    ui.cookies.clear()
    ui.cookies.set(COOKIE, session_cookie(ui, ui.mint(user, list(groups))), path="/ui")


def test_a_coordinator_reads_the_statement_page_and_downloads_its_csv(ui):
    job = _history(ui)
    _as(ui, "carol")
    accounts = ui.get("/ui/accounts")
    assert accounts.status_code == 200 and 'href="/ui/accounts/lab-a/statement"' in accounts.text
    page = ui.get(f"/ui/accounts/lab-a/statement?{MONTH}&detail=attempts")
    assert page.status_code == 200, page.text
    assert 'id="total-cost">9.00 EUR' in page.text and 'id="total-hours">3.0000' in page.text
    assert f'href="/ui/jobs/{job.id}"' in page.text
    assert "https://" not in page.text.split("<main>")[1]  # every asset from the gateway itself
    link = "/ui/accounts/lab-a/statement.csv?since=2026-11-01&amp;until=2026-12-01&amp;detail=attempts"
    assert link in page.text
    r = ui.get(link.replace("&amp;", "&"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text, newline="")))
    assert [(x["kind"], x["gpu_seconds"], x["cost"]) for x in rows] == [
        ("usage", "10800", "9.00"), ("attempt", "10800", ""), ("total", "10800", "9.00")]
    # the current month by default: nothing charged in it
    assert "Nothing charged in this period." in ui.get("/ui/accounts/lab-a/statement").text


def test_others_get_the_not_found_page_and_bad_dates_name_the_field(ui):
    _history(ui)
    _as(ui, "dave", ["lab-b"])
    r = ui.get(f"/ui/accounts/lab-a/statement?{MONTH}")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert ui.get(f"/ui/accounts/lab-a/statement.csv?{MONTH}").status_code == 404
    assert ui.get(f"/ui/accounts/lab-b/statement?{MONTH}").status_code == 200
    r = ui.get("/ui/accounts/lab-b/statement?since=2026-02-30")
    assert r.status_code == 422 and "query.since" in r.text
    ui.cookies.clear()
    assert ui.get("/ui/accounts/lab-b/statement", follow_redirects=False).status_code == 303  # to the login
