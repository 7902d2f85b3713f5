"""Pools over HTTP (#13, 4-5): PATCH /v1/admin/pools/{name}, per-pool quotas through the admin
endpoints, JobSpec.pool with backend as the deprecated alias."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.models.pools import Pool

SPEC = {"name": "j", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}


@pytest.fixture
def pool_rows(gw):
    with gw.session() as s, s.begin():
        for name, kind in (("slurm-h100", "slurm"), ("kube-a100", "kubernetes")):
            if s.get(Pool, name) is None:
                s.add(Pool(name=name, kind=kind, gpu_types=[], configured=True))
    yield
    with gw.session() as s, s.begin():
        for p in s.scalars(select(Pool).where(Pool.name.in_(["slurm-h100", "kube-a100"]))):
            s.delete(p)


def test_admins_drain_disable_enable_and_weight_a_pool(gw, pool_rows):
    admin = gw.headers("root", admin=True)
    r = gw.client.patch("/v1/admin/pools/slurm-h100", json={"state": "draining"}, headers=admin)
    assert r.status_code == 200 and r.json()["state"] == "draining" and r.json()["state_by"]
    r = gw.client.patch("/v1/admin/pools/slurm-h100", json={"weight": 2.5}, headers=admin)
    assert r.json()["weight"] == 2.5 and r.json()["state"] == "draining"
    r = gw.client.patch("/v1/admin/pools/slurm-h100", json={"state": "active"}, headers=admin)
    assert r.json()["state"] == "active"
    listed = {p["name"]: p for p in gw.client.get("/v1/admin/pools", headers=admin).json()}
    assert listed["slurm-h100"]["weight"] == 2.5 and listed["kube-a100"]["kind"] == "kubernetes"


@pytest.mark.parametrize("path, body, status, field", [
    ("/v1/admin/pools/nosuch", {"state": "draining"}, 404, None),
    ("/v1/admin/pools/slurm-h100", {"state": "paused"}, 422, "body.state"),
    ("/v1/admin/pools/slurm-h100", {"weight": 0}, 422, "body.weight"),
    ("/v1/admin/pools/slurm-h100", {"colour": "red"}, 422, "body.colour"),
    ("/v1/admin/pools/Not_A_Pool", {"state": "active"}, 422, "path.name"),
])
def test_bad_pool_patches_are_problems_naming_the_field(gw, pool_rows, path, body, status, field):
    r = gw.client.patch(path, json=body, headers=gw.headers("root", admin=True))
    assert r.status_code == status and r.headers["content-type"].startswith("application/problem+json")
    if field:
        assert field in [e["field"] for e in r.json()["errors"]], r.json()


def test_only_admins_may_patch_a_pool(gw, pool_rows):
    assert gw.client.patch("/v1/admin/pools/slurm-h100", json={"state": "draining"},
                           headers=gw.headers()).status_code == 403


def test_per_pool_quotas_through_the_admin_endpoint_and_the_deprecated_fields(gw, pool_rows):
    admin = gw.headers("root", admin=True)
    r = gw.client.put("/v1/admin/accounts/team-a/quota",
                      json={"max_gpus": 64, "max_gpus_per_pool": {"slurm-h100": 16}, "max_gpus_kubernetes": 8},
                      headers=admin)
    assert r.status_code == 200, r.text
    quota = gw.client.get("/v1/accounts/team-a/usage", headers=gw.headers()).json()["quota"]
    assert quota["max_gpus_per_pool"] == {"kubernetes": {"value": 8, "source": "team-a"},
                                          "slurm-h100": {"value": 16, "source": "team-a"}}
    assert quota["max_gpus_kubernetes"] == {"value": 8, "source": "team-a"}
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus_per_pool": {"slurm-h100": None}},
                      headers=admin)
    quota = gw.client.get("/v1/accounts/team-a/usage", headers=gw.headers()).json()["quota"]
    assert "slurm-h100" not in quota["max_gpus_per_pool"]
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus_per_pool": {"lsf": 4}}, headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.max_gpus_per_pool.lsf"
    r = gw.client.put("/v1/admin/billing-weights/nosuch/h100", json={"weight": 2}, headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "path.pool"
    r = gw.client.put("/v1/admin/billing-weights/kube-a100/A100", json={"weight": 2}, headers=admin)
    assert r.status_code == 200 and r.json() == {"pool": "kube-a100", "gpu_type": "a100", "weight": 2.0}


def test_a_job_names_a_pool_and_old_clients_still_send_backend(gw, pool_rows):
    r = gw.client.post("/v1/jobs", json={**SPEC, "pool": "kube-a100", "pool_kind": "kubernetes"}, headers=gw.headers())
    assert r.status_code == 202, r.text
    job = r.json()
    assert (job["pool"], job["backend"], job["pool_kind"], job["assigned_pool"]) == \
        ("kube-a100", "kube-a100", "kubernetes", None)
    old = gw.client.post("/v1/jobs", json={**SPEC, "backend": "slurm-h100"}, headers=gw.headers()).json()
    assert old["pool"] == old["backend"] == "slurm-h100"
    auto = gw.client.post("/v1/jobs", json=SPEC, headers=gw.headers()).json()
    assert auto["pool"] == auto["backend"] == "auto"
    listed = gw.client.get("/v1/jobs?pool=kube-a100", headers=gw.headers()).json()["items"]
    assert [j["id"] for j in listed] == [job["id"]]
    for body, field in (({**SPEC, "pool": "lsf"}, "body.pool"), ({**SPEC, "backend": "lsf"}, "body.backend"),
                        ({**SPEC, "pool": "kube-a100", "backend": "slurm-h100"}, "body"),
                        ({**SPEC, "pool_kind": "lsf"}, "body.pool_kind")):
        r = gw.client.post("/v1/jobs", json=body, headers=gw.headers())
        assert r.status_code == 422 and field in [e["field"] for e in r.json()["errors"]], (body, r.json())
