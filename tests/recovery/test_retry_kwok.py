"""A node lost under a running gang on Kubernetes (#30, docs/recovery.md): the h100 pool's kwok
node that runs the worker is deleted, as a cloud deletes a failed VM. The control plane's pod
garbage collector marks the orphaned pod ``DisruptionTarget`` and fails it, the Job fails,
and the gateway runs attempt 2, a new Job, on the pool's other node. The deleted node is
made again afterwards, as stack/kube/up.sh made it.
"""

from __future__ import annotations

import time

import pytest

from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from tests.conftest import postgres_database
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    kube_backend_options,
    kube_env,
    wired_gateway,
)
from tests.pools.test_five_pools import FINAL
from tests.storage.test_storage import k8s  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.kubernetes, pytest.mark.postgres]
POOL = "kube-h100"


@pytest.fixture(scope="module")
def gw(dev_key_path):
    env = kube_env()
    if "ISTHMUS_KUBE_H100_CLUSTER_QUEUE" not in env:
        pytest.skip("the stack's control plane has no h100 pool (re-run stack/kube/up.sh)")
    options = {**kube_backend_options(env), "cluster_queue": env["ISTHMUS_KUBE_H100_CLUSTER_QUEUE"],
               "local_queue": env["ISTHMUS_KUBE_H100_LOCAL_QUEUE"]}
    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {POOL: {"kind": "kubernetes", **options}}) as gw:
        gw.admin = gw.headers("root", admin=True)
        yield gw


def remade(core, saved) -> None:
    """The deleted kwok node again: its labels and annotations (kwok manages it by them),
    then its capacity, addresses and kubelet endpoint (kwok's server), as up.sh sets them."""
    from kubernetes import client

    meta = saved.metadata
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=meta.name, labels=meta.labels, annotations=meta.annotations)))
    st = saved.status
    status = {"status": {
        "capacity": st.capacity, "allocatable": st.allocatable,
        "addresses": [{"type": a.type, "address": a.address} for a in st.addresses],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": st.daemon_endpoints.kubelet_endpoint.port}}}}
    core.patch_node_status(meta.name, status)
    # kwok initialises the new node and may write its own --node-ip over the address meanwhile
    # (stack/kube/up.sh, "readiness"): once it is Ready kwok leaves it alone; set it again then.
    deadline = time.monotonic() + 60
    while not any(c.type == "Ready" and c.status == "True" for c in core.read_node(meta.name).status.conditions or []):
        assert time.monotonic() < deadline, f"the remade node {meta.name} never became Ready"
        time.sleep(0.5)
    core.patch_node_status(meta.name, status)


def test_a_worker_whose_node_is_deleted_runs_again_on_another_node(gw, k8s):
    _, core, _ = k8s
    r = gw.client.post("/v1/jobs", json={
        "name": "node-lost", "account": "team-a", "pool": POOL, "workers": 1, "gpus_per_worker": 8,
        "time_limit": "10m", "image": "registry.example/trainer:1", "command": ["python", "train.py"]},
        headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    job = r.json()
    running = drive_until(gw, lambda: job_state(gw, job["id"], "running"), timeout_s=90)
    ns, name = running["backend_job_id"].split("/", 1)
    pods = drive_until(gw, lambda: [p for p in core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
                                    if p.spec.node_name], timeout_s=30)
    node = pods[0].spec.node_name
    saved = core.read_node(node)
    core.delete_node(node)
    try:
        # The pod GC fails orphaned pods after its quarantine (40 s), then the Job fails.
        done = drive_until(gw, lambda: (j := job_state(gw, job["id"], "running", *FINAL)) and j["attempt"] == 2 and j,
                           timeout_s=150)
    finally:
        time.sleep(0.5)
        if not any(n.metadata.name == node for n in core.list_node().items):
            remade(core, saved)
    (first,) = done["attempts"]
    assert first["outcome"] == "node_failure" and first["nodes"] == [node], first
    assert done["state"] == "running" and done["nodes"] and done["nodes"] != [node], done
    assert done["backend_job_id"] != running["backend_job_id"], done
    gw.client.post(f"/v1/jobs/{job['id']}/cancel", headers=gw.admin)
    drive_until(gw, lambda: job_state(gw, job["id"], *FINAL), timeout_s=60)
    with gw.app.state.sessionmaker() as s:
        assert ledger_reading.verify(s) == []
        assert ledger_rules.charged_gpu_seconds(s, job_id=job["id"]) > 0
