"""GET /v1/accounts/{name}/statement over HTTP (issue #49, item 3), on SQLite and Postgres:
who may read which statement, JSON and CSV alike, bad input as problem+json naming the field."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.domain.prices import PriceList
from gateway.identity.setup import build_dev_issuer
from gateway.kit.db import transaction
from gateway.kit.settings import Settings
from gateway.ledger import service as ledger
from tests.ledger.dbfixtures import add_job

T = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)
MONTH = "since=2026-11-01&until=2026-12-01"


@pytest.fixture
def api(db_url, tmp_path):
    settings = Settings(database_url=db_url, dev_mode=True, dev_key_path=tmp_path / "key.pem", dev_accounts="")
    issuer = build_dev_issuer(settings)
    app = create_app(settings)
    with TestClient(app) as client:
        # What the pools file's prices become at start-up (gateway/pools/config.py load_prices).
        app.state.prices = PriceList(currency="EUR", pools={"slurm": {"h100": Decimal("2.40"),
                                                                      "default": Decimal("1.25")}})
        client.headers_of = lambda user, groups=(), admin=False: {
            "Authorization": f"Bearer {issuer.mint(user=user, groups=list(groups), admin=admin)}"}
        client.admin = client.headers_of("root", admin=True)
        for body in ({"name": "org"}, {"name": "team-a", "parent": "org"}, {"name": "team-a-ml", "parent": "team-a"},
                     {"name": "team-b", "parent": "org"}):
            assert client.post("/v1/admin/accounts", json=body, headers=client.admin).status_code == 201
        for account, user in (("team-a", "carol"), ("team-b", "dave")):
            assert client.put(f"/v1/admin/accounts/{account}/members/{user}", json={"role": "coordinator"},
                              headers=client.admin).status_code == 200
        with transaction(app.state.sessionmaker) as s:
            for account, gpus, hours, gpu_type in (("team-a", 4, 2, "h100"), ("team-a-ml", 2, 3, None),
                                                   ("team-b", 8, 1, "h100")):
                job = add_job(s, account, gpus=gpus, time_limit_s=10 * 3600, gpu_type=gpu_type)
                ledger.reserve(s, job=job, pool="slurm", actor="t", now=T)
                ledger.record_start(s, job=job, started_at=T, actor="t")
                ledger.record_finish(s, job=job, started_at=T, ended_at=T + timedelta(hours=hours), actor="t",
                                     half_life_s=7 * 86400)
        yield client


def _problem(r, status, field=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    if field:
        assert field in [e["field"] for e in r.json().get("errors") or []], r.json()


def test_a_coordinator_reads_the_subtree_as_json_and_csv(api):
    carol = api.headers_of("carol")
    r = api.get(f"/v1/accounts/team-a/statement?{MONTH}&children=true&detail=attempts", headers=carol)
    assert r.status_code == 200, r.text
    st = r.json()
    assert [(x["account"], x["gpu_type"], x["gpu_seconds"], x["price_per_gpu_hour"], x["cost"]) for x in st["lines"]] \
        == [("team-a", "h100", 4 * 2 * 3600, "2.40", "19.20"), ("team-a-ml", None, 2 * 3 * 3600, "1.25", "7.50")]
    assert st["gpu_seconds"] == 14 * 3600 and st["cost"] == "26.70" and st["currency"] == "EUR"
    assert [len(x["attempts"]) for x in st["lines"]] == [1, 1] and st["lines"][0]["attempts"][0]["attempt"] == 1
    assert st["budget"]["used_gpu_seconds"] == 14 * 3600
    for extra, accept in (("&format=csv", {}), ("", {"Accept": "text/csv"})):
        r = api.get(f"/v1/accounts/team-a/statement?{MONTH}&children=true{extra}", headers={**carol, **accept})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), r.text
        assert "attachment" in r.headers["content-disposition"]
        rows = list(csv.DictReader(io.StringIO(r.text, newline="")))
        assert rows[-1]["kind"] == "total" and int(rows[-1]["gpu_seconds"]) == st["gpu_seconds"]
        assert rows[-1]["cost"] == st["cost"]
    r = api.get(f"/v1/accounts/team-a/statement.csv?{MONTH}", headers=carol)
    assert r.status_code == 200 and r.text.count("\r\n") == 3  # header, team-a's line, total
    # an admin reads every account's; the whole tree adds up
    r = api.get(f"/v1/accounts/org/statement?{MONTH}&children=true", headers=api.admin)
    assert r.json()["gpu_seconds"] == 22 * 3600 and r.json()["cost"] == "45.90"


def test_who_may_read_which_statement(api):
    carol, dave = api.headers_of("carol"), api.headers_of("dave")
    member = api.headers_of("erin", groups=["team-a"])  # in the account by the token, coordinates nothing
    _problem(api.get(f"/v1/accounts/team-a/statement?{MONTH}", headers=dave), 404)  # another account's coordinator
    _problem(api.get(f"/v1/accounts/org/statement?{MONTH}", headers=carol), 404)  # above the coordinated account
    _problem(api.get(f"/v1/accounts/nope/statement?{MONTH}", headers=api.admin), 404)
    _problem(api.get(f"/v1/accounts/team-a/statement?{MONTH}"), 401)
    # a member sees the account's own statement (as its usage), not its sub-accounts' lines
    r = api.get(f"/v1/accounts/team-a/statement?{MONTH}", headers=member)
    assert r.status_code == 200 and [x["account"] for x in r.json()["lines"]] == ["team-a"]
    _problem(api.get(f"/v1/accounts/team-a/statement?{MONTH}&children=true", headers=member), 403)
    assert api.get(f"/v1/accounts/team-a-ml/statement?{MONTH}", headers=carol).status_code == 200


@pytest.mark.parametrize("query, field", [
    ("since=2026-13-01", "query.since"), ("until=yesterday", "query.until"),
    ("since=2026-11-02&until=2026-11-01", "query.until"), ("since=2000-01-01&until=2026-11-01", "query.since"),
    ("detail=entries", "query.detail"), ("children=maybe", "query.children"),
])
def test_bad_input_names_the_field(api, query, field):
    _problem(api.get(f"/v1/accounts/team-a/statement?{query}", headers=api.admin), 422, field)
    _problem(api.get(f"/v1/accounts/team-a/statement.csv?{query}", headers=api.admin), 422, field)


def test_the_cli_prints_the_statement_and_its_csv(api, monkeypatch):
    from click.testing import CliRunner

    from gateway.admin import cli as admin_cli
    from gateway.admin import cli_statement

    def through_the_app(self, url, token):  # the CLI's HTTP client, pointed at this app
        self.http = api
        api.headers.update(api.headers_of("carol"))

    monkeypatch.setattr(cli_statement.Client, "__init__", through_the_app)
    run = CliRunner().invoke
    out = run(admin_cli.admin, ["statement", "team-a", "--since", "2026-11-01", "--until", "2026-12-01", "--children"])
    assert out.exit_code == 0, out.output
    assert "team-a-ml" in out.output and "total: 14.0000 GPU-h (50400 GPU-s), cost 26.70 EUR" in out.output
    out = run(admin_cli.admin, ["statement", "team-a", "--since", "2026-11-01", "--until", "2026-12-01", "--csv"])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.output, newline="")))
    assert [(r["kind"], r["gpu_seconds"], r["cost"]) for r in rows] == [("usage", "28800", "19.20"),
                                                                        ("total", "28800", "19.20")]
    out = run(admin_cli.admin, ["statement", "team-b", "--since", "2026-11-01"])
    assert out.exit_code != 0 and "404" in out.output
