"""Finding 8: GPU types have one (lower-case) form at every boundary.

A billing weight could not be set for ``NVIDIA-H100-80GB-HBM3`` (the admin pattern was
lower case only) and the lookup compared case-sensitively, so such jobs were billed at
the pool default.
"""

from __future__ import annotations

from sqlalchemy import select

from adapters.base import Capacity, PoolCapacity, site_gpu_type
from gateway.domain.routing import JobShape, PoolView, check_pinned
from gateway.kit.db import transaction
from gateway.ledger import service as ledger
from gateway.models.jobs import Job
from gateway.models.ledger import LedgerEntry

PRODUCT = "NVIDIA-H100-80GB-HBM3"


def _reserve_entry(gw, job_id: str) -> LedgerEntry:
    with transaction(gw.app.state.sessionmaker) as s:
        ledger.reserve(s, job=s.get(Job, job_id), pool="slurm", actor="test")
    with gw.session() as s:
        return s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job_id, LedgerEntry.kind == "reserve")).one()


def test_weight_for_an_upper_case_product_name_bills_such_jobs(gw):
    admin = gw.headers(user="adm", admin=True)
    r = gw.client.put(f"/v1/admin/billing-weights/slurm/{PRODUCT}", json={"weight": 3.0}, headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["gpu_type"] == PRODUCT.lower()

    r = gw.client.post("/v1/jobs", json={"name": "h", "account": "team-a", "command": ["true"], "workers": 1,
                                         "gpus_per_worker": 2, "gpu_type": PRODUCT, "time_limit": "1h"},
                       headers=gw.headers())
    assert r.status_code == 202, r.text
    assert r.json()["gpu_type"] == PRODUCT.lower()
    entry = _reserve_entry(gw, r.json()["id"])
    assert entry.billing_weight == 3.0
    assert entry.committed_gpu_seconds == 2 * 3600 * 3


def test_same_type_in_another_case_is_the_same_weight(gw):
    admin = gw.headers(user="adm", admin=True)
    assert gw.client.put("/v1/admin/billing-weights/slurm/h100", json={"weight": 2.0}, headers=admin).status_code == 200
    r = gw.client.put("/v1/admin/billing-weights/slurm/H100", json={"weight": 4.0}, headers=admin)
    assert r.status_code == 200
    weights = gw.client.get("/v1/admin/billing-weights", headers=admin).json()
    assert [w for w in weights if w["pool"] == "slurm" and w["gpu_type"].lower() == "h100"] == [
        {"pool": "slurm", "gpu_type": "h100", "weight": 4.0}]


def test_job_recorded_in_mixed_case_is_billed_at_the_normalised_weight(gw):
    admin = gw.headers(user="adm", admin=True)
    assert gw.client.put("/v1/admin/billing-weights/slurm/h100", json={"weight": 2.0}, headers=admin).status_code == 200
    r = gw.client.post("/v1/jobs", json={"name": "h", "account": "team-a", "command": ["true"], "workers": 1,
                                         "gpus_per_worker": 1, "gpu_type": "h100", "time_limit": "1h"},
                       headers=gw.headers())
    job_id = r.json()["id"]
    with transaction(gw.app.state.sessionmaker) as s:  # as recorded before types were normalised
        job = s.get(Job, job_id)
        job.spec = {**job.spec, "gpu_type": "H100"}
    assert _reserve_entry(gw, job_id).billing_weight == 2.0


class _Pool:
    """Stands in for a backend's capacity() only (routing is pure logic)."""

    def capacity(self):
        return Capacity(backend="slurm", pools=(PoolCapacity(pool="gpu", total_nodes=2, idle_nodes=2, total_gpus=16,
                                                             free_gpus=16, gpus_per_node=8, gpu_types=("H100",)),))


def test_routing_matches_gpu_types_without_case():
    views = {"slurm": PoolView.of_capacity("slurm", None, _Pool().capacity())}
    shape = JobShape(workers=1, gpus_per_worker=8, total_gpus=8, image=None, gpu_type="h100")
    assert check_pinned(shape, "slurm", views) in (None, "")


def test_adapters_send_the_sites_spelling():
    assert site_gpu_type(PRODUCT.lower(), ["NVIDIA-A100", PRODUCT]) == PRODUCT
    assert site_gpu_type("h100", ["a100"]) == "h100"
    assert site_gpu_type(None, ["a100"]) is None
