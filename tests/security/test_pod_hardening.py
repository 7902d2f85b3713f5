"""Hostile label keys (issue #12, finding 9): keys the Job controller, Kueue, Kubernetes or the
gateway own are refused with problem+json naming body.labels, and no job is recorded."""

from __future__ import annotations

import pytest

HOSTILE = ["job-name", "controller-uid", "batch.kubernetes.io/job-name", "batch.kubernetes.io/controller-uid",
           "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class", "isthmus.io/managed-by",
           "isthmus.io/gateway-job-id", "isthmus.io/account", "isthmus.io/user", "app.kubernetes.io/name",
           "kubernetes.io/hostname", "node-role.kubernetes.io/control-plane", "k8s.io/x", "Job-Name"]


@pytest.mark.parametrize("key", HOSTILE)
def test_reserved_label_keys_are_refused(gw, key):
    r = gw.client.post("/v1/jobs", headers=gw.headers("alice", ("team-a",)), json={
        "name": "labels", "account": "team-a", "command": ["true"], "labels": {"project": "x", key: "v"}})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == ["body.labels"], r.json()
    assert "reserved" in r.json()["errors"][0]["message"]
    assert gw.client.get("/v1/jobs", headers=gw.headers("alice", ("team-a",))).json()["items"] == []


@pytest.mark.parametrize("key", ["project", "team", "example.com/owner", "isthmus.io/fake-run-for",
                                 "notkubernetes.io/x"])
def test_ordinary_label_keys_are_kept(gw, key):
    r = gw.client.post("/v1/jobs", headers=gw.headers("alice", ("team-a",)), json={
        "name": "labels", "account": "team-a", "command": ["true"], "labels": {key: "v"}})
    assert r.status_code == 202, r.text
    assert r.json()["labels"] == {key: "v"}
