"""Kueue Topology Aware Scheduling in the adapter, on hand-built objects (no cluster):
the pool's level words, its domains from node labels, and the pod template's annotation."""

import pytest

from adapters.base import SubmissionRejected, SubmitRequest, TopologyRequest
from adapters.kubernetes.capacity import node_domains
from adapters.kubernetes.render import (
    TAS_PREFERRED,
    TAS_REQUIRED,
    level_word,
    render_job,
    topology_levels,
)
from adapters.kubernetes.settings import KubernetesSettings

RACK = "topology.isthmus.io/topology-rack"
LEVELS = (("rack", RACK), ("host", "kubernetes.io/hostname"))


def req(topology=None) -> SubmitRequest:
    return SubmitRequest(gateway_job_id="g1", name="n", account="team-a", user="alice", command=["true"],
                         workers=2, gpus_per_worker=8, cpus_per_worker=1, memory_mib_per_worker=1024,
                         time_limit_s=60, topology=topology)


def template_annotations(job: dict) -> dict:
    return job["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize(("label", "word"), [
    ("cloud.provider.com/topology-rack", "rack"), ("example.com/block", "block"), ("kubernetes.io/hostname", "host"),
    ("Rack", "rack"), ("example.com/topology.zone", "zone"), ("example.com/9x", ""), ("example.com/a_b", "")])
def test_level_words(label, word):
    assert level_word(label) == word


def test_levels_keep_the_first_of_a_word_and_drop_unusable_labels():
    assert topology_levels([RACK, "other.io/rack", "x.io/_bad", "kubernetes.io/hostname"]) == LEVELS


def test_required_and_preferred_become_the_levels_node_label():
    s = KubernetesSettings(cluster_queue="cq", local_queue="lq")
    ann = template_annotations(render_job(req(TopologyRequest("rack", True)), s, LEVELS))
    assert ann[TAS_REQUIRED] == RACK and TAS_PREFERRED not in ann
    ann = template_annotations(render_job(req(TopologyRequest("host", False)), s, LEVELS))
    assert ann[TAS_PREFERRED] == "kubernetes.io/hostname" and TAS_REQUIRED not in ann


def test_no_wish_packs_at_the_highest_level_and_a_pool_without_levels_adds_nothing():
    s = KubernetesSettings(cluster_queue="cq", local_queue="lq")
    assert template_annotations(render_job(req(), s, LEVELS))[TAS_PREFERRED] == RACK
    ann = template_annotations(render_job(req(), s))
    assert not any(k.startswith("kueue.x-k8s.io/podset-") for k in ann)


def test_a_level_the_pool_has_not_is_refused_naming_the_levels():
    s = KubernetesSettings(cluster_queue="cq", local_queue="lq")
    with pytest.raises(SubmissionRejected, match=r"no topology level 'block' \(levels: rack, host\)"):
        render_job(req(TopologyRequest("block", True)), s, LEVELS)
    with pytest.raises(SubmissionRejected, match=r"levels: none"):
        render_job(req(TopologyRequest("rack", False)), s)


def test_domains_group_the_pools_nodes_by_each_levels_label():
    labels = {"n1": {RACK: "r1", "kubernetes.io/hostname": "n1"}, "n2": {RACK: "r1", "kubernetes.io/hostname": "n2"},
              "n3": {RACK: "r2", "kubernetes.io/hostname": "n3"}, "n4": {"kubernetes.io/hostname": "n4"}}
    domains = node_domains(LEVELS, labels, idle={"n2", "n3", "n4"})
    racks = {(d.name, d.nodes, d.idle_nodes) for d in domains if d.level == "rack"}
    assert racks == {("r1", ("n1", "n2"), 1), ("r2", ("n3",), 1)}  # n4 has no rack: in none
    assert sum(d.level == "host" for d in domains) == 4
