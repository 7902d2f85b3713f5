"""Node health on the real local control plane (issue #48; docs/kubernetes.md, "Node health"):
a gang kept off excluded nodes, the gateway's cordon and uncordon of a kwok node (and not of one
someone else cordoned), and a NotReady node reported with its reason.

Every test puts back what it changed (uncordoned, Ready again, kwok managing the node) in a
``finally``; none assumes more of the cluster than the lane's settling gives (tests/lanes.py).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adapters.base import BackendError, BackendState, Feature, features_of
from adapters.kubernetes import KubernetesBackend
from adapters.kubernetes.nodes import ANN_DRAINED
from adapters.kubernetes.settings import read_env_file

from .conftest import request
from .test_gang import wait_state

pytestmark = [pytest.mark.kubernetes]
KWOK_MANAGED = "kwok.x-k8s.io/node"  # kwok manages the nodes with this annotation = fake (stack/kube/kwok.sh)
UNHEALTHY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@pytest.fixture(scope="module")
def drainer(settings):
    """The a100 pool's backend with cordons allowed (drain_suspect_nodes)."""
    b = KubernetesBackend(dataclasses.replace(settings, drain_suspect_nodes=True))
    yield b
    b.close()


@pytest.fixture(scope="module")
def pool_nodes(kube, kube_env) -> list[str]:
    """The a100 pool's kwok nodes, by name."""
    selector = f"{kube_env['ISTHMUS_KUBE_GPU_TYPE_LABEL']}={kube_env['ISTHMUS_KUBE_GPU_TYPE']}"
    names = sorted(n.metadata.name for n in kube.core.list_node(label_selector=selector).items)
    assert len(names) >= 3, names
    return names


def restore(kube, name: str) -> None:
    """Uncordoned, without the gateway's annotation (a merge patch: null deletes)."""
    kube.core.patch_node(name, {"metadata": {"annotations": {ANN_DRAINED: None}}, "spec": {"unschedulable": None}})


def cordon_of(kube, name: str) -> tuple[bool, str | None]:
    node = kube.core.read_node(name)
    return bool(node.spec.unschedulable), (node.metadata.annotations or {}).get(ANN_DRAINED)


def test_a_gang_lands_only_on_the_nodes_it_is_not_kept_off(backend, kube, clean, accounts, pool_nodes):
    *excluded, allowed = pool_nodes
    req = dataclasses.replace(request(f"excl-{uuid.uuid4().hex[:8]}", account=accounts[0], workers=2, gpus=4),
                              exclude_nodes=tuple(excluded))
    job = backend.submit(req).backend_job_id
    try:
        wait_state(backend, job, {BackendState.RUNNING})
        pods = kube.pods_of(job)
        assert len(pods) == 2 and {p.spec.node_name for p in pods} == {allowed}, \
            [(p.metadata.name, p.spec.node_name) for p in pods]
        terms = pods[0].spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        (expr,) = terms.node_selector_terms[0].match_expressions
        assert (expr.key, expr.operator, sorted(expr.values)) == ("kubernetes.io/hostname", "NotIn", sorted(excluded))
    finally:
        backend.cancel(job)


def test_drain_cordons_with_the_reason_and_resume_lifts_only_the_gateways_cordon(drainer, backend, h100, kube,
                                                                                  pool_nodes):
    mine, theirs = pool_nodes[0], pool_nodes[1]
    assert features_of(drainer).has(Feature.NODE_DRAIN) and not features_of(backend).has(Feature.NODE_DRAIN)
    assert cordon_of(kube, mine) == cordon_of(kube, theirs) == (False, None), "an earlier run left a cordon"
    try:
        drainer.drain_node(mine, "isthmus: jobs of 2 accounts failed here\nwithin 1 h")
        assert cordon_of(kube, mine) == (True, "isthmus: jobs of 2 accounts failed here within 1 h")
        problems = drainer.node_problems()
        assert problems[mine] == "cordoned by the gateway (isthmus: jobs of 2 accounts failed here within 1 h)"
        assert mine not in h100.node_problems()  # another pool's node: not in its problems
        drainer.drain_node(mine, "isthmus: jobs of 2 accounts failed here within 1 h")  # again: no change

        kube.core.patch_node(theirs, {"spec": {"unschedulable": True}})  # an admin's cordon
        assert drainer.node_problems()[theirs] == "cordoned"
        drainer.drain_node(theirs, "suspect")  # not taken over: it stays the admin's
        drainer.resume_node(theirs)
        assert cordon_of(kube, theirs) == (True, None)

        drainer.resume_node(mine)
        assert cordon_of(kube, mine) == (False, None)
        assert mine not in drainer.node_problems()
        drainer.resume_node(mine)  # nothing to undo: no error

        h100_node = kube.core.list_node(label_selector="nvidia.com/gpu.product=h100").items[0].metadata.name
        with pytest.raises(BackendError, match="not one of ClusterQueue"):
            drainer.drain_node(h100_node, "not this pool's")
        assert cordon_of(kube, h100_node) == (False, None)
    finally:
        restore(kube, mine)
        restore(kube, theirs)


def _ready(kube, name: str) -> bool:
    node = kube.core.read_node(name)
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    return ready and not any(t.key in UNHEALTHY_TAINTS for t in node.spec.taints or [])


def test_a_not_ready_node_is_reported_with_its_reason(backend, kube, pool_nodes):
    name = pool_nodes[-1]
    node = kube.core.read_node(name)
    assert (node.metadata.annotations or {}).get(KWOK_MANAGED) == "fake" and _ready(kube, name)
    addresses = [{"type": a.type, "address": a.address} for a in node.status.addresses]
    now = datetime.now(UTC).isoformat()
    try:
        # kwok resets a managed node's Ready condition at once: it lets this one go first.
        kube.core.patch_node(name, {"metadata": {"annotations": {KWOK_MANAGED: "paused-by-test"}}})
        kube.core.patch_node_status(name, {"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "lastHeartbeatTime": now,
             "lastTransitionTime": now, "message": "container runtime network not ready: NetworkReady=false"}]}})
        assert backend.node_problems()[name] == ("NotReady: Ready=False (KubeletNotReady: container runtime "
                                                 "network not ready: NetworkReady=false)")
    finally:
        now = datetime.now(UTC).isoformat()
        kube.core.patch_node_status(name, {"status": {"addresses": addresses, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
             "lastTransitionTime": now, "message": "kubelet is posting ready status"}]}})
        kube.core.patch_node(name, {"metadata": {"annotations": {KWOK_MANAGED: "fake"}}})
        deadline = time.monotonic() + 30
        while not _ready(kube, name):  # the node controller lifts its not-ready taints
            assert time.monotonic() < deadline, f"{name} not Ready and untainted again: {kube.core.read_node(name).spec}"
            time.sleep(0.3)
    assert name not in backend.node_problems()


def test_the_real_node_is_healthy_though_tainted(settings):
    """The one real node (stack/kube/node.sh) is tainted NoSchedule by design: a taint alone is
    not a problem. Its pool's node_problems names it only if its kubelet is not Ready."""
    env_file = Path(settings.kubeconfig).parent / "node.env"
    if not env_file.exists():
        pytest.skip(f"{env_file} missing: the stack's real node is not up (stack/kube/node.sh)")
    env = read_env_file(env_file)
    b = KubernetesBackend(dataclasses.replace(settings, cluster_queue=env["ISTHMUS_KUBE_NODE_CLUSTER_QUEUE"],
                                              local_queue=env["ISTHMUS_KUBE_NODE_LOCAL_QUEUE"]))
    try:
        node = b._connect().core.read_node(env["ISTHMUS_KUBE_NODE_NAME"])
        assert any(t.effect == "NoSchedule" for t in node.spec.taints or []), node.spec.taints
        assert b.node_problems() == {}
    finally:
        b.close()
