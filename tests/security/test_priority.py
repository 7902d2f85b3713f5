"""Hostile attempts to pick a cluster-wide priority class (issue #12, finding 4). Only an
administrator sets an account's class; a user's job priority and labels cannot."""

from __future__ import annotations

from gateway.models.accounts import Account


def _jobs(gw):
    return gw.client.get("/v1/jobs", headers=gw.headers("root", (), admin=True)).json()["items"]


def _body(**kw):
    return {"name": "prio", "account": "team-a", "command": ["true"], **kw}


def test_a_job_cannot_name_a_priority_class(gw):
    h = gw.headers("alice", ("team-a",))
    for body, field in ((_body(priority_class="isthmus-high"), "body.priority_class"),
                        (_body(labels={"kueue.x-k8s.io/priority-class": "isthmus-high"}), "body.labels"),
                        (_body(labels={"KUEUE.X-K8S.IO/priority-class": "isthmus-high"}), "body.labels"),
                        (_body(priority=1001), "body.priority")):
        r = gw.client.post("/v1/jobs", json=body, headers=h)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert [e["field"] for e in r.json()["errors"]] == [field], r.json()
    assert _jobs(gw) == []


def test_only_an_admin_sets_an_accounts_priority_class(gw):
    for who in (gw.headers("alice", ("team-a",)), gw.headers("carol", ("team-b",))):
        r = gw.client.patch("/v1/admin/accounts/team-a", json={"priority_class": "isthmus-high"}, headers=who)
        assert r.status_code == 403, r.text
    admin = gw.headers("root", (), admin=True)
    for bad in ("Isthmus-High", "high; rm -rf /", "-high", "a" * 254, "high\n"):
        r = gw.client.patch("/v1/admin/accounts/team-a", json={"priority_class": bad}, headers=admin)
        assert r.status_code == 422, (bad, r.text)
        assert [e["field"] for e in r.json()["errors"]] == ["body.priority_class"], r.json()
    with gw.session() as s:
        assert s.get(Account, "team-a").priority_class is None  # nothing changed
    r = gw.client.patch("/v1/admin/accounts/team-a", json={"priority_class": "isthmus-high"}, headers=admin)
    assert r.status_code == 200 and r.json()["priority_class"] == "isthmus-high", r.text
    assert gw.client.get("/v1/admin/accounts/team-a", headers=admin).json()["priority_class"] == "isthmus-high"
    r = gw.client.patch("/v1/admin/accounts/team-a", json={"shares": 2}, headers=admin)
    assert r.json()["priority_class"] == "isthmus-high"  # untouched when absent
    r = gw.client.patch("/v1/admin/accounts/team-a", json={"priority_class": None}, headers=admin)
    assert r.status_code == 200 and r.json()["priority_class"] is None
