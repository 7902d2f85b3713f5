"""Storage through the API with pools that cannot be reached (#29): what a gateway answers at
submit from its configuration alone. The same rules on the real clusters: test_storage.py.

The pools are tests/pools/test_config.py's five, whose Slurm and Kubernetes endpoints nothing
answers: the start-up check of the claims cannot ask the API server, so the gateway says so
in its log and starts (docs/storage.md)."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.cli import run_migrations
from gateway.identity.dev import DevIssuer
from gateway.kit.settings import Settings
from tests.pools.test_config import FIVE, _file

STORAGE = """
storage:
  - name: data
    path: /shared/data
    pools: {slurm-22: {}, kube-a100: {pvc: data}}
  - name: ckpt
    path: /shared/ckpt
    mode: read-write
    pools: {slurm-22: {}, slurm-24: {}}
  - name: secret
    path: /shared/secret
    mode: read-write
    accounts: [team-a]
    pools: {slurm-22: {}}
"""


@pytest.fixture
def api(tmp_path, caplog):
    url = f"sqlite:///{tmp_path}/gw.db"
    run_migrations(url)
    settings = Settings(database_url=url, dev_mode=True, dev_key_path=tmp_path / "k.pem", dev_accounts="team-a,team-b",
                        pools_file=str(_file(tmp_path, FIVE + STORAGE)), dispatch_in_serve=False)
    with caplog.at_level(logging.WARNING, logger="isthmus"), TestClient(create_app(settings)) as client:
        issuer = DevIssuer(issuer=settings.dev_issuer, audience=settings.audience, key_path=settings.dev_key_path)
        client.as_ = lambda user, account: {"Authorization": "Bearer " + issuer.mint(user=user, groups=[account])}
        client.log = caplog
        yield client


def test_an_unreachable_api_server_is_a_warning_not_a_refusal_to_start(api):
    notes = [r.getMessage() for r in api.log.get_records("setup") if "not checked" in r.getMessage()]
    assert notes and notes[0].startswith("storage 'data' on pool 'kube-a100': not checked ("), notes


def test_job_sets_keep_the_rules_of_single_jobs(api):
    alice, bob = api.as_("alice", "team-a"), api.as_("bob", "team-b")
    body = {"name": "s", "account": "team-b", "command": ["true"], "array": {"count": 2},
            "mounts": [{"storage": "secret"}]}
    r = api.post("/v1/job-sets", json=body, headers=bob)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.mounts[0].storage", r.text
    body = {"name": "s", "account": "team-a", "command": ["true"], "array": {"count": 2},
            "checkpoint": {"storage": "ckpt"}, "resume_from": "00000000-0000-4000-8000-000000000000"}
    r = api.post("/v1/job-sets", json=body, headers=alice)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.resume_from", r.text
    # Each task of a set keeps its own checkpoints.
    del body["resume_from"]
    r = api.post("/v1/job-sets", json=body, headers=alice)
    assert r.status_code == 202, r.text
    tasks = api.get(f"/v1/job-sets/{r.json()['id']}/tasks", headers=alice).json()["items"]
    dirs = [api.get(f"/v1/jobs/{t['id']}", headers=alice).json()["checkpoint_dir"] for t in tasks]
    assert dirs == [f"/shared/ckpt/team-a/checkpoints/{t['id']}" for t in tasks]


def test_mounts_are_kept_as_asked_and_a_spec_without_them_is_stored_as_before(api):
    alice = api.as_("alice", "team-a")
    plain = {"name": "p", "account": "team-a", "command": ["true"]}
    r = api.post("/v1/jobs", json=plain, headers={**alice, "Idempotency-Key": "k1"})
    assert r.status_code == 202 and r.json()["mounts"] is None and r.json()["checkpoint_dir"] is None
    from gateway.jobs.schemas import JobSpec

    assert not {"mounts", "checkpoint", "resume_from"} & set(JobSpec.model_validate(plain).stored())
    r = api.post("/v1/jobs", json={**plain, "mounts": [{"storage": "data", "read_only": True}],
                                   "checkpoint": {"storage": "ckpt"}}, headers=alice)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["mounts"] == [{"storage": "data", "path": None, "read_only": True}]
    assert job["checkpoint_dir"] == f"/shared/ckpt/team-a/checkpoints/{job['id']}"
    storage = api.get("/v1/storage", headers=api.as_("bob", "team-b")).json()["items"]
    assert [(s["name"], s["directories"]) for s in storage] == [
        ("ckpt", {"team-b": "/shared/ckpt/team-b"}), ("data", {"team-b": "/shared/data"})]
