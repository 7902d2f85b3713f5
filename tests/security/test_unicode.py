"""Strings that are not Unicode (issue #45, finding 4; docs/security.md 45.4).

A lone UTF-16 surrogate, written as JSON's ``\\udfff`` escape, passed validation: a job set
with ``env: {"A": "\\udfff"}`` was accepted and from then on every list page holding one of
its tasks answered 500. Every body-taking route now refuses it with a 422 naming the field,
and stores nothing; a row stored before the check still lists.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from gateway.models.jobs import Job

JOB = '{"name": "t", "account": "team-a", "command": ["true"], "gpus_per_worker": 1, "time_limit": "10m"'
ADMIN = ("root", (), True)

# (user, method, path, raw JSON body with a lone surrogate, the field the 422 must name)
CASES = [
    ("alice", "POST", "/v1/jobs", JOB + ', "env": {"A": "\\udfff"}}', "body.env.A"),
    ("alice", "POST", "/v1/jobs", JOB + ', "env": {"K\\ud800": "v"}}', "body.env.K\ud800"),
    ("alice", "POST", "/v1/jobs", JOB.replace('"t"', '"a\\uDC00b"') + "}", "body.name"),
    ("alice", "POST", "/v1/jobs", JOB.replace('["true"]', '["echo", "\\udfff"]') + "}", "body.command.1"),
    ("alice", "POST", "/v1/job-sets", JOB + ', "env": {"A": "\\udfff"}, "array": {"count": 3}}', "body.env.A"),
    ("alice", "POST", "/v1/job-sets",
     JOB + ', "sweep": {"lr": ["0.1", "\\ud83d"]}, "env": {"LR": "{{ lr }}"}}', "body.sweep.lr.1"),
    ("alice", "POST", "/v1/accounts/team-a/webhooks", '{"url": "https://example.invalid/\\udfff"}', "body.url"),
    ("root", "PATCH", "/v1/admin/accounts/team-a", '{"description": "x\\udfffy"}', "body.description"),
]


def _headers(gw, user):
    return gw.headers("root", (), admin=True) if user == "root" else gw.headers(user, ("team-a",))


def _jobs(gw):
    return gw.client.get("/v1/jobs", headers=gw.headers("alice", ("team-a",))).json()["items"]


@pytest.mark.parametrize("user,method,path,body,field", CASES, ids=[f"{c[2]}-{c[4]}" for c in CASES])
def test_a_lone_surrogate_is_refused_with_the_field_named_and_nothing_is_stored(gw, user, method, path, body,
                                                                                 field):
    before = gw.client.get("/v1/admin/accounts/team-a", headers=gw.headers("root", (), admin=True)).json()
    r = gw.client.request(method, path, content=body.encode(),
                          headers={**_headers(gw, user), "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert _jobs(gw) == []
    assert gw.client.get("/v1/accounts/team-a/webhooks", headers=_headers(gw, "alice")).json()["items"] == []
    after = gw.client.get("/v1/admin/accounts/team-a", headers=gw.headers("root", (), admin=True)).json()
    assert after == before


def test_a_surrogate_pair_is_one_character_and_is_accepted(gw):
    body = JOB + ', "env": {"A": "\\ud83d\\ude00"}}'
    r = gw.client.post("/v1/jobs", content=body.encode(),
                       headers={**_headers(gw, "alice"), "Content-Type": "application/json"})
    assert r.status_code == 202, r.text
    job = gw.client.get(f"/v1/jobs/{r.json()['id']}", headers=_headers(gw, "alice")).json()
    assert job["env"] == {"A": "\U0001F600"}


def test_a_row_stored_before_the_check_does_not_break_the_list(gw):
    """A job whose stored spec holds a lone surrogate (as the review's did) still lists, for
    its owner and an admin, with and without a state filter; the string comes back escaped."""
    r = gw.client.post("/v1/jobs", json=json.loads(JOB + ', "env": {"A": "ok"}}'), headers=_headers(gw, "alice"))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    with gw.session() as s:
        spec = s.get(Job, job_id).spec
        poisoned = json.dumps({**spec, "env": {"A": "\udfff"}})  # ensure_ascii: "\udfff" as an escape
        s.execute(text("UPDATE job SET spec = :spec WHERE id = :id"), {"spec": poisoned, "id": job_id})
        s.commit()
    for headers in (_headers(gw, "alice"), gw.headers("root", (), admin=True)):
        for params in ({}, {"state": "pending"}):
            listed = gw.client.get("/v1/jobs", params=params, headers=headers)
            assert listed.status_code == 200, listed.text
            assert [j["id"] for j in listed.json()["items"]] == [job_id]
        one = gw.client.get(f"/v1/jobs/{job_id}", headers=headers)
        assert one.status_code == 200 and one.json()["env"] == {"A": "\udfff"}
