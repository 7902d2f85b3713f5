"""The admin API and the user account views, over HTTP, on SQLite and Postgres."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.identity.setup import build_dev_issuer
from gateway.kit.db import transaction
from gateway.kit.settings import Settings
from gateway.kit.timeutil import utcnow
from gateway.ledger import service as ledger
from tests.ledger.dbfixtures import add_job


@pytest.fixture
def api(db_url, tmp_path):
    settings = Settings(database_url=db_url, dev_mode=True, dev_key_path=tmp_path / "key.pem",
                        dev_accounts="")
    issuer = build_dev_issuer(settings)
    app = create_app(settings)
    with TestClient(app) as client:
        client.admin = {"Authorization": f"Bearer {issuer.mint(user='root', admin=True)}"}
        client.alice = {"Authorization": f"Bearer {issuer.mint(user='alice', groups=['team-a'])}"}
        client.bob = {"Authorization": f"Bearer {issuer.mint(user='bob', groups=['team-b'])}"}
        client.factory = app.state.sessionmaker
        yield client


def _tree(api):
    for body in ({"name": "org", "shares": 1, "quota": {"max_gpus": 64, "budget_gpu_hours": 100}},
                 {"name": "team-a", "parent": "org", "shares": 3, "quota": {"max_gpus": 32}},
                 {"name": "team-b", "parent": "org", "shares": 1}):
        r = api.post("/v1/admin/accounts", json=body, headers=api.admin)
        assert r.status_code == 201, r.text


def _problem(r, status, field=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    if field:
        assert field in [e["field"] for e in body.get("errors") or []], body
    return body


def test_admin_routes_need_the_admin_role(api):
    _tree(api)
    for method, path, body in [("GET", "/v1/admin/accounts", None), ("POST", "/v1/admin/accounts", {"name": "x"}),
                               ("PUT", "/v1/admin/accounts/org/quota", {"max_gpus": 1}),
                               ("GET", "/v1/admin/ledger", None), ("GET", "/v1/admin/usage", None),
                               ("GET", "/v1/admin/fairshare", None), ("DELETE", "/v1/admin/accounts/team-b", None),
                               ("POST", "/v1/admin/ledger/adjustments",
                                {"account": "team-a", "kind": "credit", "gpu_hours": 1, "reason": "x"})]:
        _problem(api.request(method, path, json=body, headers=api.alice), 403)
        _problem(api.request(method, path, json=body), 401)
    assert api.get("/v1/admin/accounts/team-b", headers=api.admin).status_code == 200


def test_quota_inheritance_and_user_view(api):
    _tree(api)
    r = api.get("/v1/accounts/team-a/usage", headers=api.alice)
    assert r.status_code == 200, r.text
    u = r.json()
    assert u["quota"]["max_gpus"] == {"value": 32, "source": "team-a"}
    assert u["quota"]["budget_gpu_hours"] == {"value": 100.0, "source": "org"}
    assert u["remaining_gpu_hours"] == 100.0 and u["fairshare"]["norm_shares"] == pytest.approx(0.75)
    # confined to own accounts: others' are "not found", the list shows only team-a
    _problem(api.get("/v1/accounts/team-b/usage", headers=api.alice), 404)
    _problem(api.get("/v1/accounts/org/usage", headers=api.alice), 404)
    assert [a["name"] for a in api.get("/v1/accounts", headers=api.alice).json()["items"]] == ["team-a"]
    assert len(api.get("/v1/accounts", headers=api.admin).json()["items"]) == 3
    # a recorded coordinator of org sees the subtree
    assert api.put("/v1/admin/accounts/org/members/bob", json={"role": "coordinator"},
                   headers=api.admin).status_code == 200
    assert [a["name"] for a in api.get("/v1/accounts", headers=api.bob).json()["items"]] == ["org", "team-a", "team-b"]


def test_bad_input_is_refused_and_changes_nothing(api):
    _tree(api)
    cases = [
        ("PUT", "/v1/admin/accounts/team-a/quota", {"max_gpus": -1}, 422, "body.max_gpus"),
        ("PUT", "/v1/admin/accounts/team-a/quota", {"max_gpus": 10**9}, 422, "body.max_gpus"),
        ("PUT", "/v1/admin/accounts/team-a/quota", {"budget_gpu_hours": -5}, 422, "body.budget_gpu_hours"),
        ("PUT", "/v1/admin/accounts/team-a/quota", {"budget_period": "week"}, 422, "body.budget_period"),
        ("PUT", "/v1/admin/accounts/nope/quota", {"max_gpus": 1}, 404, None),
        ("POST", "/v1/admin/accounts", {"name": "x", "parent": "nope"}, 422, "body.parent"),
        ("POST", "/v1/admin/accounts", {"name": "Bad Name"}, 422, "body.name"),
        ("POST", "/v1/admin/accounts", {"name": "y", "shares": -3}, 422, "body.shares"),
        ("POST", "/v1/admin/accounts", {"name": "team-a"}, 409, None),
        ("PATCH", "/v1/admin/accounts/org", {"parent": "team-a"}, 422, "body.parent"),
        ("PATCH", "/v1/admin/accounts/org", {"parent": "org"}, 422, "body.parent"),
        ("DELETE", "/v1/admin/accounts/org", None, 409, None),
        ("POST", "/v1/admin/ledger/adjustments", {"account": "nope", "kind": "credit", "gpu_hours": 1,
                                                  "reason": "x"}, 422, "body.account"),
        ("POST", "/v1/admin/ledger/adjustments", {"account": "org", "kind": "credit", "gpu_hours": -1,
                                                  "reason": "x"}, 422, "body.gpu_hours"),
        ("POST", "/v1/admin/ledger/adjustments", {"account": "org", "kind": "refund", "gpu_hours": 1,
                                                  "reason": "x"}, 422, "body.job_id"),
        ("GET", "/v1/admin/ledger?cursor=zzz", None, 422, "query.cursor"),
        ("GET", "/v1/admin/usage?account=nope", None, 422, "query.account"),
    ]
    before = api.get("/v1/admin/accounts", headers=api.admin).json()
    for method, path, body, status, field in cases:
        _problem(api.request(method, path, json=body, headers=api.admin), status, field)
    assert api.get("/v1/admin/accounts", headers=api.admin).json() == before
    assert api.get("/v1/admin/ledger", headers=api.admin).json()["items"] == []


def test_delete_refused_with_active_jobs_then_allowed(api):
    _tree(api)
    api.post("/v1/admin/accounts", json={"name": "sub", "parent": "team-b"}, headers=api.admin)
    with transaction(api.factory) as s:
        job_id = add_job(s, "sub", gpus=1).id
    body = _problem(api.delete("/v1/admin/accounts/sub", headers=api.admin), 409)
    assert "active job" in body["detail"]
    from gateway.models.jobs import Job

    with transaction(api.factory) as s:
        s.delete(s.get(Job, job_id))
    api.put("/v1/admin/accounts/sub/members/alice", json={"role": "member"}, headers=api.admin)
    assert api.delete("/v1/admin/accounts/sub", headers=api.admin).status_code == 204
    _problem(api.get("/v1/admin/accounts/sub", headers=api.admin), 404)


def test_credits_ledger_pages_usage_csv_and_fairshare(api):
    _tree(api)
    now = utcnow()
    with transaction(api.factory) as s:
        for _i, pool in enumerate(["slurm", "kubernetes", "slurm"]):
            job = add_job(s, "team-a", gpus=2, time_limit_s=7200, pool=pool)
            start = now - timedelta(hours=1)
            ledger.reserve(s, job=job, pool=pool, actor="test", now=start)
            ledger.record_start(s, job=job, started_at=start, actor="test")
            ledger.record_finish(s, job=job, started_at=start, ended_at=now, actor="test", half_life_s=7 * 86400)
    r = api.post("/v1/admin/ledger/adjustments", headers=api.admin,
                 json={"account": "team-a", "kind": "credit", "gpu_hours": 1.5, "reason": "outage"})
    assert r.status_code == 201 and r.json()["gpu_seconds"] == -5400 and r.json()["actor"] == "dev:root"
    # 6 GPU-h used, 1.5 credited, of 100 at org
    u = api.get("/v1/accounts/team-a/usage", headers=api.alice).json()
    assert (u["used_gpu_hours"], u["remaining_gpu_hours"]) == (4.5, 95.5)
    # cursor pagination over 3 x (reserve, start, usage, release) + credit
    seen, cursor = [], None
    while True:
        page = api.get("/v1/admin/ledger", params={"limit": 5, **({"cursor": cursor} if cursor else {})},
                       headers=api.admin).json()
        seen += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == 13 and [e["id"] for e in seen] == sorted(e["id"] for e in seen)
    usage = api.get("/v1/admin/ledger", params={"kind": "usage", "pool": "slurm"}, headers=api.admin).json()
    assert [e["gpu_seconds"] for e in usage["items"]] == [7200, 7200]
    assert api.get("/v1/admin/ledger", params={"account": "org", "include_subaccounts": True},
                   headers=api.admin).json()["items"].__len__() == 13
    # CSV both ways
    for kw in ({"params": {"format": "csv"}}, {"headers": {"Accept": "text/csv"}}):
        r = api.get("/v1/admin/usage", **{**kw, "headers": {**api.admin, **kw.get("headers", {})}})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(r.text)))
        month = now.strftime("%Y-%m")
        got = {(x["account"], x["pool"], x["period"]): x for x in rows}
        assert got[("team-a", "slurm", month)]["usage_gpu_seconds"] == "14400"
        assert got[("team-a", "kubernetes", month)]["jobs"] == "1"
        assert got[("team-a", "", month)]["adjustment_gpu_seconds"] == "-5400"
    assert len(api.get("/v1/admin/usage", headers=api.admin).json()["items"]) == 3
    fs = api.get("/v1/admin/fairshare", headers=api.admin).json()["items"]
    assert [f["account"] for f in fs] == ["org", "team-a", "team-b"]
    assert fs[1]["raw_usage_gpu_hours"] == pytest.approx(6.0, rel=1e-3) and fs[1]["factor"] < fs[2]["factor"]
    # Like sshare per cluster: the same decayed usage split over pools, parts adding up to it,
    # for the account and its parent; the credit (no pool) is not job usage.
    for f in fs[:2]:
        assert f["raw_usage_gpu_hours_per_pool"] == {"kubernetes": pytest.approx(2.0, rel=1e-3),
                                                     "slurm": pytest.approx(4.0, rel=1e-3)}, f
    assert fs[2]["raw_usage_gpu_hours_per_pool"] == {}


def test_openapi_declares_problems_and_operation_ids(api):
    spec = api.get("/openapi.json").json()
    for path, ops in spec["paths"].items():
        if not path.startswith(("/v1/admin", "/v1/accounts")):
            continue
        for op in ops.values():
            assert op["operationId"] and op["summary"] and op["tags"]
            assert "401" in op["responses"], path
            if path.startswith("/v1/admin"):
                assert "403" in op["responses"], path
