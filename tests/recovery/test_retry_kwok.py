"""A node lost under a running gang on Kubernetes (#30, docs/recovery.md): the h100 pool's kwok
node that runs the worker is deleted, as a cloud deletes a failed VM. The control plane's pod
garbage collector marks the orphaned pod ``DisruptionTarget`` and fails it, the Job fails,
and the gateway runs attempt 2, a new Job, on the pool's other node. The deleted node is
made again afterwards, as stack/kube/up.sh made it.

Node health (#48, docs/recovery.md "Node health"): the failure is on the node's record, the
retry's Job is told to avoid the node (a required NotIn affinity) although it is back; when
the same node fails a second account's gang, the gateway cordons it with its reason, and an
admin's clear uncordons it.
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
    options["drain_suspect_nodes"] = True
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


def submit(gw, account: str) -> dict:
    who = {"team-a": "alice", "team-b": "bob"}[account]
    r = gw.client.post("/v1/jobs", json={
        "name": "node-lost", "account": account, "pool": POOL, "workers": 1, "gpus_per_worker": 8,
        "time_limit": "10m", "image": "registry.example/trainer:1", "command": ["python", "train.py"]},
        headers=gw.headers(who, (account,)))
    assert r.status_code == 202, r.text
    return r.json()


def lose_node_under(gw, core, job: dict) -> tuple[dict, str]:
    """Delete the node under the job's running worker; wait for the gateway to see the attempt end
    (attempt 2 running, or the job ended); make the node again. Returns (the job then, the node)."""
    running = drive_until(gw, lambda: job_state(gw, job["id"], "running"), timeout_s=90)
    ns, name = running["backend_job_id"].split("/", 1)
    pods = drive_until(gw, lambda: [p for p in core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
                                    if p.spec.node_name], timeout_s=30)
    node = pods[0].spec.node_name
    saved = core.read_node(node)
    core.delete_node(node)
    try:
        # The pod GC fails orphaned pods after its quarantine (40 s), then the Job fails.
        done = drive_until(gw, lambda: (j := job_state(gw, job["id"], "running", *FINAL))
                           and (j["attempt"] == running["attempt"] + 1 or j["state"] in FINAL) and j, timeout_s=150)
    finally:
        time.sleep(0.5)
        if not any(n.metadata.name == node for n in core.list_node().items):
            remade(core, saved)
    return done, node


def not_in(job) -> list[str]:
    """The nodes a Job's pods are kept off (its required kubernetes.io/hostname NotIn affinity)."""
    terms = ((((job.spec.template.spec.affinity or {}) and job.spec.template.spec.affinity.node_affinity)
              and job.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution)
             or None)
    out = []
    for term in (terms.node_selector_terms if terms else []):
        for e in term.match_expressions or []:
            if e.key == "kubernetes.io/hostname" and e.operator == "NotIn":
                out += list(e.values)
    return out


def test_a_node_lost_under_a_gang_is_avoided_by_its_retry_and_cordoned_once_it_fails_two_accounts(gw, k8s):
    _, core, batch = k8s
    job = submit(gw, "team-a")
    running = drive_until(gw, lambda: job_state(gw, job["id"], "running"), timeout_s=90)
    done, node = lose_node_under(gw, core, job)
    assert done["attempt"] == 2, done
    (first,) = done["attempts"]
    assert first["outcome"] == "node_failure" and first["nodes"] == [node], first
    assert done["state"] == "running" and done["nodes"] and done["nodes"] != [node], done
    assert done["backend_job_id"] != running["backend_job_id"], done
    # Node health: the retry's Job is kept off the node that failed it, though the node is back.
    ns, name = done["backend_job_id"].split("/", 1)
    assert not_in(batch.read_namespaced_job(name, ns)) == [node]
    record = {n["node"]: n for n in gw.client.get("/v1/admin/nodes", params={"pool": POOL}, headers=gw.admin).json()}
    assert record[node]["failures"] == 1 and record[node]["accounts"] == ["team-a"], record
    assert not record[node]["suspect"] and record[node]["lost_gpu_hours"] > 0, record[node]
    gw.client.post(f"/v1/jobs/{job['id']}/cancel", headers=gw.admin)
    drive_until(gw, lambda: job_state(gw, job["id"], *FINAL), timeout_s=60)
    with gw.app.state.sessionmaker() as s:
        assert ledger_reading.verify(s) == []
        assert ledger_rules.charged_gpu_seconds(s, job_id=job["id"]) > 0

    # The same node lost under another account's gang: now it is suspect, and cordoned.
    # Gangs of team-b until one lands on that node (the others hold the pool's other nodes).
    others, job = [], None
    for _ in range(3):
        candidate = submit(gw, "team-b")
        got = drive_until(gw, lambda c=candidate: job_state(gw, c["id"], "running"), timeout_s=90)
        if got["nodes"] == [node]:
            job = candidate
            break
        others.append(candidate)
    assert job is not None, f"no team-b gang landed on {node}"
    for other in others:
        gw.client.post(f"/v1/jobs/{other['id']}/cancel", headers=gw.admin)
    lose_node_under(gw, core, job)
    cordoned = drive_until(gw, lambda: (n := core.read_node(node)).spec.unschedulable and n, timeout_s=60)
    why = (cordoned.metadata.annotations or {}).get("isthmus.io/drained", "")
    assert why.startswith("isthmus:") and "team-a" in why and "team-b" in why, why
    suspect = gw.client.get("/v1/admin/nodes", params={"pool": POOL, "suspect": "true"}, headers=gw.admin).json()
    assert [n["node"] for n in suspect] == [node] and suspect[0]["drained_at"], suspect
    r = gw.client.post(f"/v1/admin/nodes/{POOL}/{node}/clear", headers=gw.admin)
    assert r.status_code == 200 and not r.json()["suspect"], r.text
    after = core.read_node(node)
    assert not after.spec.unschedulable and "isthmus.io/drained" not in (after.metadata.annotations or {})
    gw.client.post(f"/v1/jobs/{job['id']}/cancel", headers=gw.admin)
    drive_until(gw, lambda: job_state(gw, job["id"], *FINAL), timeout_s=60)
