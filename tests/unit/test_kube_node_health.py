"""Node health in the Kubernetes adapter without a cluster (issue #48; docs/kubernetes.md,
"Node health"): the excluded nodes' affinity in the rendered Job, the names it accepts, what
makes a node a problem, and NODE_DRAIN following the pool's ``drain_suspect_nodes``."""

from __future__ import annotations

import pytest

from adapters.base import (
    BackendError,
    BackendUnavailable,
    Feature,
    SubmissionRejected,
    SubmitRequest,
    Unsupported,
    features_of,
)
from adapters.kubernetes import KubernetesBackend, KubernetesSettings
from adapters.kubernetes.nodes import ANN_DRAINED, node_problem
from adapters.kubernetes.render import add_node_exclusion, render_job

SETTINGS = KubernetesSettings(cluster_queue="cq", local_queue="lq")


def req(**kw) -> SubmitRequest:
    return SubmitRequest(gateway_job_id="g1", name="n", account="team-a", user="alice", command=["true"],
                         workers=2, gpus_per_worker=8, cpus_per_worker=1, memory_mib_per_worker=1024,
                         time_limit_s=60, **kw)


def pod_spec(request: SubmitRequest) -> dict:
    return render_job(request, SETTINGS)["spec"]["template"]["spec"]


def test_excluded_nodes_become_a_required_hostname_not_in_and_the_gpu_type_selector_stays():
    spec = pod_spec(req(gpu_type="a100", exclude_nodes=("kwok-gpu-2", "node-1.example.com", "kwok-gpu-2")))
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "a100"}
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["kwok-gpu-2", "node-1.example.com"]}]}]}


def test_no_excluded_nodes_no_affinity_and_the_job_name_does_not_depend_on_them():
    assert "affinity" not in pod_spec(req())
    # The attempt's Job keeps its deterministic name (adoption compares names, never the body).
    assert render_job(req(), SETTINGS)["metadata"] == render_job(req(exclude_nodes=("n1",)), SETTINGS)["metadata"]


def test_an_exclusion_is_added_to_every_term_already_there():
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]}]}}}}
    add_node_exclusion(spec, ["bad-node"])
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    not_in = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad-node"]}
    assert terms[0]["matchExpressions"] == [{"key": "zone", "operator": "In", "values": ["a"]}, not_in]
    assert terms[1]["matchExpressions"] == [not_in] and terms[1]["matchFields"]


@pytest.mark.parametrize("bad", ["Node-1", "node_1", "-node", "node-", "a..b", "node 1", "n1\n", "n1;rm",
                                 "", "x" * 254, "a/b", "*"])
def test_a_name_that_is_no_node_name_is_refused_naming_it(bad):
    with pytest.raises(SubmissionRejected, match="not a Kubernetes node name") as err:
        pod_spec(req(exclude_nodes=("good-node", bad)))
    assert repr(bad[:300]) in err.value.message


def test_the_longest_node_name_is_accepted():
    name = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    assert len(name) == 253
    assert pod_spec(req(exclude_nodes=(name,)))["affinity"]


def node(*, ready="True", unschedulable=False, annotations=None, **conditions) -> dict:
    conds = [{"type": "Ready", "status": ready, "reason": "KubeletNotReady" if ready != "True" else "KubeletReady",
              "message": "container runtime is down\nsince 5 min" if ready != "True" else "kubelet is posting"}]
    conds += [{"type": t, "status": s, "reason": f"{t}Reason"} for t, s in conditions.items()]
    return {"metadata": {"name": "n1", "annotations": annotations or {}},
            "spec": {"unschedulable": True} if unschedulable else {}, "status": {"conditions": conds}}


def test_a_healthy_node_has_no_problem():
    assert node_problem(node(MemoryPressure="False", DiskPressure="False", NetworkUnavailable="False")) == ""


def test_what_makes_a_node_a_problem():
    assert node_problem(node(ready="False")) == \
        "NotReady: Ready=False (KubeletNotReady: container runtime is down since 5 min)"
    assert node_problem(node(ready="Unknown")).startswith("NotReady: Ready=Unknown")
    assert node_problem({"metadata": {"name": "n"}, "status": {}}) == "NotReady (the node reports no Ready condition)"
    assert node_problem(node(unschedulable=True)) == "cordoned"
    assert node_problem(node(unschedulable=True, annotations={ANN_DRAINED: "2 accounts' jobs failed"})) == \
        "cordoned by the gateway (2 accounts' jobs failed)"
    # The annotation alone (someone uncordoned the node) is no problem.
    assert node_problem(node(annotations={ANN_DRAINED: "old"})) == ""
    assert node_problem(node(DiskPressure="True", GPUUnhealthy="True", KernelDeadlock="False")) == \
        "DiskPressure (DiskPressureReason); GPUUnhealthy (GPUUnhealthyReason)"
    assert node_problem(node(ready="False", unschedulable=True, PIDPressure="True")) == \
        ("NotReady: Ready=False (KubeletNotReady: container runtime is down since 5 min); cordoned; "
         "PIDPressure (PIDPressureReason)")


def test_node_drain_follows_the_pools_setting_and_node_health_is_always_there():
    off = features_of(KubernetesBackend(SETTINGS))
    assert off.has(Feature.NODE_HEALTH) and not off.has(Feature.NODE_DRAIN)
    assert "drain_suspect_nodes: false" in off.why_not(Feature.NODE_DRAIN)
    on = features_of(KubernetesBackend(KubernetesSettings(cluster_queue="cq", local_queue="lq",
                                                          drain_suspect_nodes=True)))
    assert on.has(Feature.NODE_HEALTH) and on.has(Feature.NODE_DRAIN)
    with pytest.raises(Unsupported, match="drain_suspect_nodes: false"):
        KubernetesBackend(SETTINGS).drain_node("kwok-gpu-1", "suspect")  # refused before any API call


def test_the_setting_comes_from_the_environment_too():
    assert KubernetesSettings.from_env(env={"ISTHMUS_KUBE_DRAIN_SUSPECT_NODES": "true"}).drain_suspect_nodes
    assert not KubernetesSettings.from_env(env={}).drain_suspect_nodes


def test_a_bad_node_name_is_refused_before_any_api_call():
    backend = KubernetesBackend(KubernetesSettings(drain_suspect_nodes=True))
    for call in (lambda: backend.drain_node("../nodes/x", "r"), lambda: backend.resume_node("Node 1")):
        with pytest.raises(SubmissionRejected, match="not a Kubernetes node name"):
            call()


class FakeNodes:
    """The node calls drain_node and resume_node make, on dicts; a 409 when the patch's
    resourceVersion is stale, as the API server's precondition."""

    class ApiException(Exception):
        def __init__(self, status: int):
            super().__init__(status)
            self.status, self.body, self.reason = status, None, "Conflict"

    def __init__(self, nodes: dict[str, dict], *, race: int = 0):
        self.nodes, self.patches, self.race = nodes, [], race
        self.exc, self.core = self.ApiException, self

    def read_node(self, name):
        if name not in self.nodes:
            raise self.ApiException(404)
        return self.nodes[name]

    def patch_node(self, name, patch):
        node = self.nodes[name]
        if self.race:  # someone else changes it between our read and our patch
            self.race -= 1
            node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        if patch["metadata"]["resourceVersion"] != node["metadata"]["resourceVersion"]:
            raise self.ApiException(409)
        self.patches.append(patch)
        ann = node["metadata"].setdefault("annotations", {})
        for k, v in patch["metadata"].get("annotations", {}).items():
            ann.pop(k, None) if v is None else ann.__setitem__(k, v)
        node["spec"]["unschedulable"] = patch["spec"]["unschedulable"] or False
        return node


@pytest.fixture
def fake():
    def make(**nodes):
        api = FakeNodes({name: {"metadata": {"name": name, "resourceVersion": "1", "annotations": ann or {}},
                                "spec": {"unschedulable": cordoned}} for name, (cordoned, ann) in nodes.items()})
        b = KubernetesBackend(KubernetesSettings(drain_suspect_nodes=True))
        b._connect = lambda: api
        b._raw = lambda fn, *args, **kw: fn(*args)
        b._queue.cluster_queue = lambda _api: {}
        b._queue.queue_nodes = lambda _api, _cq, nodes: [n for n in nodes if not n["metadata"]["name"].startswith("h100")]
        return b, api
    return make


def test_drain_and_resume_on_a_fake_api(fake):
    b, api = fake(n1=(False, None), admins=(True, None), h100=(False, None))
    b.drain_node("n1", "two accounts\n failed")
    assert api.nodes["n1"]["spec"]["unschedulable"] and api.nodes["n1"]["metadata"]["annotations"] == {
        ANN_DRAINED: "two accounts failed"}
    b.drain_node("n1", "two accounts failed")  # the same: no second patch
    b.drain_node("admins", "suspect")  # someone else's cordon: not taken over
    b.resume_node("admins")
    assert len(api.patches) == 1 and api.nodes["admins"]["spec"]["unschedulable"]
    with pytest.raises(BackendError, match="not one of ClusterQueue"):
        b.drain_node("h100", "x")
    with pytest.raises(BackendError, match="no node gone"):
        b.drain_node("gone", "x")
    b.resume_node("gone")  # nothing to undo
    b.resume_node("n1")
    assert api.nodes["n1"]["spec"]["unschedulable"] is False and api.nodes["n1"]["metadata"]["annotations"] == {}
    assert b.drain_node("n1", "y" * 5000) is None and len(api.nodes["n1"]["metadata"]["annotations"][ANN_DRAINED]) == 1000


def test_a_node_that_changed_meanwhile_is_read_again(fake):
    b, api = fake(n1=(False, None))
    api.race = 2
    b.drain_node("n1", "suspect")
    assert api.nodes["n1"]["spec"]["unschedulable"] and len(api.patches) == 1
    api.race = 3
    with pytest.raises(BackendUnavailable, match="kept changing"):
        b.resume_node("n1")
