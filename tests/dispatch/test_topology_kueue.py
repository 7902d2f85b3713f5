"""Topology-aware gangs on real Kueue (issue #31, part 3; docs/planning.md, "Topology").

The stack's control plane has a third pool for Kueue's Topology Aware Scheduling
(stack/kube/up.sh): ClusterQueue ``isthmus-rack`` over four kwok nodes, two to a rack (node
label ``topology.isthmus.io/topology-rack``: r1 = kwok-rack-1,2; r2 = kwok-rack-3,4), its
flavor naming the Topology ``isthmus-racks`` (levels: rack, host). One node of each rack is
taken by a pod bound to it directly, as a site's other users would: two nodes are idle, but
no rack has two.

- Kueue itself keeps a 2-pod Job that requires one rack unadmitted (its own topology check).
- Through the gateway, the same gang waits unsent, with the reason; when one rack frees it
  starts there: its pods' nodes, read back from Kubernetes, are that rack's, and the Job's
  pod template carries the TAS annotation with the rack label.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid

import pytest

from adapters.base import BackendState, TopologyRequest
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    kube_backend_options,
    wired_gateway,
)
from tests.dispatch.test_reservations import FINAL, USERS, get, submit

pytestmark = pytest.mark.kubernetes


@pytest.fixture(scope="module")
def database_url(postgres_database_url):
    return postgres_database_url


@pytest.fixture(scope="module")
def rack(kube):
    if "ISTHMUS_KUBE_RACK_CLUSTER_QUEUE" not in kube:
        pytest.skip("the stack's control plane has no TAS pool (re-run stack/kube/up.sh)")
    per_rack = int(kube["ISTHMUS_KUBE_RACK_NODES_PER_RACK"])
    nodes = [f"kwok-rack-{i}" for i in range(1, int(kube["ISTHMUS_KUBE_RACK_NODES"]) + 1)]
    racks = {f"r{i // per_rack + 1}": set() for i in range(len(nodes))}
    for i, n in enumerate(nodes):
        racks[f"r{i // per_rack + 1}"].add(n)
    return {"options": {**kube_backend_options(kube), "cluster_queue": kube["ISTHMUS_KUBE_RACK_CLUSTER_QUEUE"],
                        "local_queue": kube["ISTHMUS_KUBE_RACK_LOCAL_QUEUE"]},
            "label": kube["ISTHMUS_KUBE_RACK_LABEL"], "racks": racks, "ns": f"isthmus-{'team-b'}"}


@contextlib.contextmanager
def holders(core, ns: str, nodes: list[str]):
    """Pods bound to ``nodes`` (no scheduler, no Kueue), each taking all of its node's GPUs."""
    from kubernetes import client

    names = []
    try:
        for node in nodes:
            name = f"holder-{node}-{uuid.uuid4().hex[:6]}"
            core.create_namespaced_pod(ns, client.V1Pod(
                metadata=client.V1ObjectMeta(name=name, labels={"isthmus.io/test": "topology-holder"}),
                spec=client.V1PodSpec(node_name=node, restart_policy="Never", containers=[client.V1Container(
                    name="hold", image="busybox", command=["sleep", "600"],
                    resources=client.V1ResourceRequirements(requests={"nvidia.com/gpu": "8", "cpu": "1"},
                                                            limits={"nvidia.com/gpu": "8", "cpu": "1"}))])))
            names.append(name)
        yield names
    finally:
        for name in names:
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_a_gang_that_requires_one_rack_waits_for_one_and_lands_in_it(database_url, dev_key_path, rack, k8s):
    core, _, batch = k8s
    r1, r2 = sorted(rack["racks"])
    with wired_gateway(database_url, dev_key_path, {"kubernetes": rack["options"]},
                       scheduling_policy="reservation") as gw:
        def views():
            return gw.app.state.dispatcher.views(fresh=True)["kubernetes"]

        view = drive_until(gw, lambda: (v := views()).idle_nodes == v.total_nodes == 4 and v, timeout_s=120)
        assert view.domains["rack"] == {r1: 2, r2: 2}, view.domains
        assert view.topology_sizes["rack"] == 2
        (pool,) = gw.client.get("/v1/pools", headers=gw.headers(USERS["team-a"], ("team-a",))).json()["items"]
        assert {d["name"]: set(d["nodes"]) for d in pool["topology"] if d["level"] == "rack"} == rack["racks"], pool

        # A level the pool has not: refused at once, naming the levels it has.
        r = gw.client.post("/v1/jobs", headers=gw.headers(USERS["team-a"], ("team-a",)), json={
            "name": "topo", "account": "team-a", "pool": "kubernetes", "workers": 2, "gpus_per_worker": 8,
            "command": ["true"], "topology": {"required": "block"}})
        assert r.status_code == 422 and "no network domains of level 'block' (levels: host, rack)" in r.text, r.text

        first = [min(rack["racks"][r1]), min(rack["racks"][r2])]
        with holders(core, rack["ns"], first) as held:
            drive_until(gw, lambda: views().idle_nodes == 2, timeout_s=60)

            # Kueue alone: a Job that requires one rack is not admitted (its own TAS check).
            backend = gw.app.state.dispatcher.backends["kubernetes"]
            direct = backend.submit(dataclasses.replace(
                _request(f"native-{uuid.uuid4().hex[:6]}"), topology=TopologyRequest("rack", True))).backend_job_id
            try:
                status = None
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    status = backend.status(direct)
                    if "topology" in (status.reason or "").lower():
                        break
                    time.sleep(0.5)
                assert status is not None and status.state is BackendState.QUEUED, status
                assert "topology" in status.reason.lower(), status.reason
            finally:
                backend.cancel(direct)

            gang = submit(gw, "team-a", pool="kubernetes", workers=2, run_s=2, time_limit="5m",
                          topology={"required": "rack"})
            for _ in range(3):
                gw.app.state.dispatcher.run_once()
            waiting = get(gw, gang)
            assert waiting["state"] == "pending" and waiting["backend_job_id"] is None, waiting
            assert f"no rack of kubernetes has room for 2 workers of 8 GPUs (room: {r1} 1, {r2} 1)" in \
                waiting["state_reason"], \
                waiting["state_reason"]

            # One rack frees: the gang starts there.
            core.delete_namespaced_pod(held[1], rack["ns"], grace_period_seconds=0)
            running = drive_until(gw, lambda: job_state(gw, gang, "running", *FINAL), timeout_s=120)
            ns, name = running["backend_job_id"].split("/")
            job = batch.read_namespaced_job(name, ns)
            assert job.spec.template.metadata.annotations["kueue.x-k8s.io/podset-required-topology"] == rack["label"]
            pods = core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={name}").items
            assert {p.spec.node_name for p in pods} == rack["racks"][r2], [p.spec.node_name for p in pods]
            done = drive_until(gw, lambda: job_state(gw, gang, *FINAL), timeout_s=120)
            assert done["state"] == "succeeded", done
            assert set(done["nodes"]) == rack["racks"][r2], done["nodes"]


def _request(gid: str):
    from tests.backends.kubernetes.conftest import request

    return dataclasses.replace(request(gid, account="team-a", workers=2, gpus=8), labels={})
