"""What a Kueue pool holds: the nodes its ClusterQueue's ResourceFlavors select, their GPUs
free and idle, the Topology levels (``QueueCapacity.capacity``), and the limits a job must fit
(the largest node, the queue's quota: ``QueueCapacity.check_fits``).

The adapter (backend.py) hands in its API plumbing (connect, error mapping, raw JSON calls);
what is read is cached here: the flavors and the limits for 30 s, the GPU types until the
next capacity read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from adapters.base import (
    Capacity,
    PoolCapacity,
    SubmissionRejected,
    SubmitRequest,
    TopologyDomain,
)

from .render import KUEUE_GROUP, KUEUE_VERSION, topology_levels
from .settings import KubernetesSettings

log = logging.getLogger(__name__)


def _quantity(value: Any) -> float:
    """A Kubernetes quantity ("32", "256Gi", "500m") as a float in base units."""
    s = str(value).strip()
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
                "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3}
    for suf in sorted(suffixes, key=len, reverse=True):
        if s.endswith(suf):
            return float(s[: -len(suf)]) * suffixes[suf]
    return float(s)


def node_domains(levels: tuple[tuple[str, str], ...], node_labels: dict[str, dict[str, str]],
                 idle: set[str], free: dict[str, int] | None = None) -> tuple[TopologyDomain, ...]:
    """The pool's domains at each Topology level: its GPU nodes grouped by the level's node
    label (a node without the label is in no domain of that level), with the idle ones and
    each node's free GPUs (``free``)."""
    out = []
    for word, label in levels:
        groups: dict[str, list[str]] = {}
        for node, labels in node_labels.items():
            if labels.get(label):
                groups.setdefault(str(labels[label]), []).append(node)
        for name, members in sorted(groups.items()):
            members.sort()
            out.append(TopologyDomain(level=word, name=name, nodes=tuple(members),
                                      idle_nodes=sum(n in idle for n in members),
                                      free_gpus=tuple(int((free or {}).get(n, 0)) for n in members)))
    return tuple(out)


class QueueCapacity:
    """The pool's ClusterQueue, its flavors' nodes and what they hold, read through the adapter."""

    def __init__(self, *, settings: KubernetesSettings, name: str, connect: Callable[[], Any],
                 errors: Callable[..., AbstractContextManager[None]], raw: Callable[..., dict]) -> None:
        self.settings = settings
        self.name = name  # the adapter's, in the errors and the capacity it reports
        self._connect, self._errors, self._raw = connect, errors, raw
        self._limits_cache: tuple[float, dict[str, float]] | None = None
        # Values of settings.gpu_type_label on the GPU nodes (learned from capacity()).
        self.gpu_types: tuple[str, ...] | None = None
        # (expiry, nodeLabels of each ResourceFlavor of the ClusterQueue, the TAS levels of its
        # flavors' Topology as (the pool's word, node label)); see queue_nodes and levels.
        self._flavor_cache: tuple[float, list[dict[str, str]], tuple[tuple[str, str], ...]] | None = None

    def queue_nodes(self, api: Any, cq: dict, nodes: list[dict]) -> list[dict]:
        """The nodes the ClusterQueue's ResourceFlavors select (by their nodeLabels).

        Several ClusterQueues (pools) share one control plane, each flavor naming its nodes
        by label (e.g. the GPU product); a flavor without nodeLabels selects every node. The
        flavors are re-read at most every 30 s. A flavor that cannot be read selects all.
        """
        selectors = self.flavors(api, cq)[0]
        if not selectors or any(not sel for sel in selectors):
            return nodes
        return [n for n in nodes
                if any(all((n["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())
                       for sel in selectors)]

    def pool_nodes(self, api: Any) -> list[dict]:
        """The pool's Node objects, read now: those its ClusterQueue's flavors select
        (queue_nodes), GPU nodes or not (node health: a node whose GPUs vanished is still the pool's)."""
        cq = self.cluster_queue(api)
        with self._errors("reading nodes"):
            nodes = self._raw(api.core.list_node)["items"]
        return self.queue_nodes(api, cq, nodes)

    def flavors(self, api: Any, cq: dict) -> tuple[list[dict[str, str]], tuple[tuple[str, str], ...]]:
        """(nodeLabels of each flavor of the ClusterQueue, the pool's topology levels), re-read
        at most every 30 s. The levels are those of the Topology object the first flavor with a
        ``topologyName`` names (Kueue's Topology Aware Scheduling), highest first, each as (the
        pool's word for it, its node label): docs/planning.md, "Topology". A Topology that
        cannot be read gives no levels (the pool then takes no topology request)."""
        now = time.monotonic()
        if self._flavor_cache is None or self._flavor_cache[0] <= now:
            selectors: list[dict[str, str]] = []
            topology_name = ""
            for grp in cq.get("spec", {}).get("resourceGroups") or []:
                for fl in grp.get("flavors") or []:
                    try:
                        rf = self._raw(api.custom.get_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                                       "resourceflavors", fl["name"])
                    except Exception:  # noqa: BLE001 - an unreadable flavor selects all nodes
                        selectors.append({})
                        continue
                    spec = rf.get("spec") or {}
                    selectors.append(dict(spec.get("nodeLabels") or {}))
                    topology_name = topology_name or str(spec.get("topologyName") or "")
            levels: tuple[tuple[str, str], ...] = ()
            if topology_name:
                try:
                    topo = self._raw(api.custom.get_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                                     "topologies", topology_name)
                    levels = topology_levels(lvl.get("nodeLabel", "") for lvl in (topo.get("spec") or {}).get("levels") or [])
                except Exception as exc:  # noqa: BLE001 - no levels: the pool takes no topology request
                    log.warning("Kueue Topology %s of ClusterQueue %s cannot be read: %s", topology_name,
                                self.settings.cluster_queue, exc)
            self._flavor_cache = (now + 30.0, selectors, levels)
        return self._flavor_cache[1], self._flavor_cache[2]

    def cluster_queue(self, api: Any) -> dict:
        """The pool's ClusterQueue object, read now."""
        with self._errors(f"reading ClusterQueue {self.settings.cluster_queue}"):
            return self._raw(api.custom.get_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                             "clusterqueues", self.settings.cluster_queue)

    def levels(self) -> tuple[tuple[str, str], ...]:
        """The pool's topology levels (see flavors), reading the ClusterQueue when not cached."""
        if self._flavor_cache is not None and self._flavor_cache[0] > time.monotonic():
            return self._flavor_cache[2]
        api = self._connect()
        cq = self.cluster_queue(api)
        return self.flavors(api, cq)[1]

    def limits(self) -> dict[str, float]:
        """Largest node allocatable and ClusterQueue nominal quota, cached for 30 s."""
        now = time.monotonic()
        if self._limits_cache and self._limits_cache[0] > now:
            return self._limits_cache[1]
        api = self._connect()
        g = self.settings.gpu_resource
        with self._errors("reading nodes"):
            nodes = self._raw(api.core.list_node)["items"]
        cq = self.cluster_queue(api)
        nodes = self.queue_nodes(api, cq, nodes)
        limits = {"node_gpu": 0.0, "node_cpu": 0.0, "node_memory": 0.0}
        for n in nodes:
            alloc = (n.get("status") or {}).get("allocatable") or {}
            limits["node_gpu"] = max(limits["node_gpu"], _quantity(alloc.get(g, 0)))
            limits["node_cpu"] = max(limits["node_cpu"], _quantity(alloc.get("cpu", 0)))
            limits["node_memory"] = max(limits["node_memory"], _quantity(alloc.get("memory", 0)))
        for key in ("quota_gpu", "quota_cpu", "quota_memory"):
            limits[key] = 0.0
        names = {g: "quota_gpu", "cpu": "quota_cpu", "memory": "quota_memory"}
        for group in cq.get("spec", {}).get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                for r in flavor.get("resources") or []:
                    if r["name"] in names:
                        limits[names[r["name"]]] += _quantity(r.get("nominalQuota", 0)) + _quantity(r.get("borrowingLimit", 0) or 0)
        self._limits_cache = (now + 30.0, limits)
        return limits

    def check_fits(self, request: SubmitRequest) -> None:
        """Refuse a job that can never fit: larger than the largest node or the queue's quota."""
        lim = self.limits()
        cq = self.settings.cluster_queue
        mem = request.memory_mib_per_worker * 2**20
        problems = []
        if request.gpus_per_worker > lim["node_gpu"]:
            problems.append(f"{request.gpus_per_worker} GPUs per worker but the largest node has {int(lim['node_gpu'])}")
        if request.cpus_per_worker > lim["node_cpu"]:
            problems.append(f"{request.cpus_per_worker} CPUs per worker but the largest node has {lim['node_cpu']:g}")
        if mem > lim["node_memory"]:
            problems.append(f"{request.memory_mib_per_worker} MiB per worker but the largest node has {lim['node_memory'] / 2**20:g} MiB")
        if request.total_gpus > lim["quota_gpu"]:
            problems.append(f"{request.total_gpus} GPUs in total but ClusterQueue {cq} has a quota of {int(lim['quota_gpu'])}")
        if request.workers * request.cpus_per_worker > lim["quota_cpu"]:
            problems.append(f"{request.workers * request.cpus_per_worker} CPUs in total exceed ClusterQueue {cq}'s quota of {lim['quota_cpu']:g}")
        if request.workers * mem > lim["quota_memory"]:
            problems.append(f"{request.workers * request.memory_mib_per_worker} MiB in total exceed ClusterQueue {cq}'s memory quota")
        if problems:
            raise SubmissionRejected("the job can never fit: " + "; ".join(problems), backend=self.name)

    def capacity(self) -> Capacity:
        """The pool's GPUs, nodes, GPU types and topology domains, read now."""
        api = self._connect()
        g, cq_name = self.settings.gpu_resource, self.settings.cluster_queue
        cq = self.cluster_queue(api)
        with self._errors("reading nodes"):
            nodes = self._raw(api.core.list_node)["items"]
        with self._errors("listing pods"):
            pods = self._raw(api.core.list_pod_for_all_namespaces,
                             field_selector="status.phase!=Succeeded,status.phase!=Failed")["items"]
        nodes = self.queue_nodes(api, cq, nodes)
        nominal = sum(_quantity(r.get("nominalQuota", 0))
                      for grp in cq.get("spec", {}).get("resourceGroups") or []
                      for fl in grp.get("flavors") or [] for r in fl.get("resources") or [] if r["name"] == g)
        reserved = sum(_quantity(r.get("total", 0))
                       for fl in (cq.get("status") or {}).get("flavorsReservation") or []
                       for r in fl.get("resources") or [] if r["name"] == g)
        gpu_nodes = {n["metadata"]["name"]: _quantity(((n.get("status") or {}).get("allocatable") or {}).get(g, 0))
                     for n in nodes}
        gpu_nodes = {k: v for k, v in gpu_nodes.items() if v > 0}
        self.gpu_types = tuple(sorted({str(label) for n in nodes if n["metadata"]["name"] in gpu_nodes
                                       for label in [(n["metadata"].get("labels") or {})
                                                     .get(self.settings.gpu_type_label)] if label}))
        used: dict[str, float] = {}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node in gpu_nodes:
                req = sum(_quantity(((c.get("resources") or {}).get("requests") or {}).get(g, 0))
                          for c in p["spec"].get("containers") or [])
                used[node] = used.get(node, 0) + req
        free_of = {n: max(0.0, cap - used.get(n, 0)) for n, cap in gpu_nodes.items()}
        idle_nodes = {n for n in gpu_nodes if used.get(n, 0) == 0}
        node_free = sum(free_of.values())
        total = int(min(nominal, sum(gpu_nodes.values()))) if gpu_nodes else 0
        free = int(max(0.0, min(nominal - reserved, node_free, total)))
        idle = len(idle_nodes)
        labels_of = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
        topology = node_domains(self.flavors(api, cq)[1], {n: labels_of[n] for n in gpu_nodes}, idle_nodes, free_of)
        per_node = int(max(gpu_nodes.values())) if gpu_nodes else 0
        pool = PoolCapacity(
            pool=cq_name, total_nodes=len(gpu_nodes), idle_nodes=idle, total_gpus=total, free_gpus=free,
            gpus_per_node=per_node, gpu_types=self.gpu_types or (), topology=topology,
            nodes=tuple(sorted(gpu_nodes)),
            detail=f"ClusterQueue {cq_name}: {int(reserved)}/{int(nominal)} {g} reserved; "
                   f"{len(gpu_nodes)} GPU nodes, {idle} idle",
        )
        return Capacity(backend=self.name, pools=(pool,))
