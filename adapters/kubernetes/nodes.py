"""Node health on a Kueue pool (issue #48; docs/kubernetes.md, "Node health"): which of the
pool's nodes are out of service and why (``Feature.NODE_HEALTH``), and the gateway's own cordon
and uncordon of a suspect node (``Feature.NODE_DRAIN``).

:class:`NodeCare` is mixed into the adapter (backend.py) and uses its settings, API plumbing
(``_connect``, ``_errors``, ``_raw``) and the pool's node selection (capacity.py
``QueueCapacity.pool_nodes``); what makes a node a problem is the pure :func:`node_problem`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from adapters.base import (
    BackendError,
    BackendUnavailable,
    Feature,
    JobNotFound,
    Unsupported,
    WithNodeDrain,
    WithNodeHealth,
)

from .render import GROUP, node_name

log = logging.getLogger(__name__)

# On a node the gateway cordoned, and only there: the reason, in one line. A cordon without it is
# someone else's, which the gateway never lifts.
ANN_DRAINED = f"{GROUP}/drained"
REASON_MAX_CHARS = 1000
NO_DRAIN = "this pool's settings do not let the gateway cordon nodes (drain_suspect_nodes: false)"


def one_line(text: Any, limit: int = 300) -> str:
    """``text`` on one line (runs of white space, newlines included, as one space), cut to ``limit``."""
    return " ".join(str(text or "").split())[:limit]


def _said(cond: Mapping[str, Any]) -> str:
    words = ": ".join(w for w in (one_line(cond.get("reason")), one_line(cond.get("message"))) if w)
    return f" ({words})" if words else ""


def node_problem(node: Mapping[str, Any]) -> str:
    """Why ``node`` (a Node object as JSON) is out of service, "" when it is not. In this order,
    joined with "; ":

    * its ``Ready`` condition is missing or not True: ``NotReady`` (``Ready=False`` or
      ``Ready=Unknown``), with the condition's reason and message;
    * it is cordoned (``spec.unschedulable``): ``cordoned``, or ``cordoned by the gateway``
      with the reason of the annotation ``isthmus.io/drained``;
    * any other condition is True: the kubelet's ``MemoryPressure``, ``DiskPressure``,
      ``PIDPressure``, the network plugin's ``NetworkUnavailable``, and whatever a problem
      detector adds (node-problem-detector's ``KernelDeadlock``, ``ReadonlyFilesystem``, a GPU
      health checker's condition): by that convention a condition other than Ready that is
      True reports a problem.
    """
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    conditions = [c for c in (node.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping)]
    out = []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        out.append("NotReady (the node reports no Ready condition)")
    elif ready.get("status") != "True":
        out.append(f"NotReady: Ready={one_line(ready.get('status'), 20) or 'missing'}{_said(ready)}")
    if spec.get("unschedulable"):
        mine = (meta.get("annotations") or {}).get(ANN_DRAINED)
        out.append("cordoned" if mine is None else f"cordoned by the gateway ({one_line(mine)})")
    out += [f"{one_line(c.get('type'), 63)}{_said(c)}" for c in conditions
            if c.get("type") != "Ready" and c.get("status") == "True"]
    return "; ".join(out)


class NodeCare(WithNodeHealth, WithNodeDrain):
    """The pool's node health and the gateway's cordons, for :class:`KubernetesBackend`."""

    # The adapter's (backend.py).
    name: str
    settings: Any
    _queue: Any
    _connect: Any
    _errors: Any
    _raw: Any

    def node_drain_unsupported(self) -> Mapping[Feature, str]:
        """``unsupported()``'s entry for NODE_DRAIN: the pool's settings must allow cordons."""
        return {} if self.settings.drain_suspect_nodes else {Feature.NODE_DRAIN: NO_DRAIN}

    def node_problems(self) -> dict[str, str]:
        """The pool's nodes (those its ClusterQueue's flavors select) that are out of service,
        with why (:func:`node_problem`). Two API reads: the ClusterQueue and the nodes."""
        out = {}
        for node in self._queue.pool_nodes(self._connect()):
            why = node_problem(node)
            if why:
                out[str(node["metadata"]["name"])] = why
        return out

    def drain_node(self, node: str, reason: str) -> None:
        """Cordon ``node``: ``spec.unschedulable: true`` and the annotation ``isthmus.io/drained``
        with ``reason`` (one line, at most 1000 characters), in one patch guarded by the node's
        resourceVersion. Its running pods are left alone (no eviction). A node someone else has
        cordoned is left as it is (not marked the gateway's, so never uncordoned by it); a
        node not of this pool is refused."""
        name = node_name(node)
        if not self.settings.drain_suspect_nodes:
            raise Unsupported(NO_DRAIN, backend=self.name)
        why = one_line(reason, REASON_MAX_CHARS) or "suspect (Isthmus gateway node health)"
        api = self._connect()
        for _ in range(3):
            current = self._read_node(name)
            if current is None:
                raise BackendError(f"no node {name} in the cluster", backend=self.name)
            if not self._queue.queue_nodes(api, self._queue.cluster_queue(api), [current]):
                raise BackendError(f"node {name} is not one of ClusterQueue {self.settings.cluster_queue}'s "
                                   f"nodes", backend=self.name)
            meta, spec = current["metadata"], current.get("spec") or {}
            ann = meta.get("annotations") or {}
            if spec.get("unschedulable") and ANN_DRAINED not in ann:
                log.info("node %s is already cordoned by someone else: left as it is", name)
                return
            if spec.get("unschedulable") and ann.get(ANN_DRAINED) == why:
                return
            patch = {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {ANN_DRAINED: why}},
                     "spec": {"unschedulable": True}}
            done = self._patch_node(name, patch, "cordoning")
            if done is None:
                raise BackendError(f"no node {name} in the cluster", backend=self.name)
            if done:
                log.warning("cordoned node %s of ClusterQueue %s: %s", name, self.settings.cluster_queue, why)
                return
        raise BackendUnavailable(f"node {name} kept changing while the gateway cordoned it; try again",
                                 backend=self.name)

    def resume_node(self, node: str) -> None:
        """Uncordon ``node`` if the gateway cordoned it (it carries ``isthmus.io/drained``):
        both the cordon and the annotation go, in one patch guarded by its resourceVersion. A
        node cordoned by someone else stays cordoned, and a node that is gone is no error
        (both logged)."""
        name = node_name(node)
        for _ in range(3):
            current = self._read_node(name)
            if current is None:
                log.info("node %s is gone: nothing to uncordon", name)
                return
            meta, spec = current["metadata"], current.get("spec") or {}
            if ANN_DRAINED not in (meta.get("annotations") or {}):
                if spec.get("unschedulable"):
                    log.info("node %s was cordoned by someone else, not the gateway: left cordoned", name)
                return
            # Strategic merge: null deletes the annotation and the field (unschedulable: false).
            patch = {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {ANN_DRAINED: None}},
                     "spec": {"unschedulable": None}}
            done = self._patch_node(name, patch, "uncordoning")
            if done is None:
                log.info("node %s is gone: nothing to uncordon", name)
                return
            if done:
                log.warning("uncordoned node %s of ClusterQueue %s (the gateway had cordoned it)", name,
                            self.settings.cluster_queue)
                return
        raise BackendUnavailable(f"node {name} kept changing while the gateway uncordoned it; try again",
                                 backend=self.name)

    def _read_node(self, name: str) -> dict | None:
        api = self._connect()
        try:
            with self._errors(f"reading node {name}", not_found=f"no node {name}"):
                return self._raw(api.core.read_node, name)
        except JobNotFound:
            return None

    def _patch_node(self, name: str, patch: dict, what: str) -> bool | None:
        """Patch the node (strategic merge): True when done, False when its resourceVersion
        changed meanwhile (409: read it again), None when it is gone."""
        api = self._connect()
        try:
            with self._errors(f"{what} node {name}", not_found=f"no node {name}"):
                self._raw(api.core.patch_node, name, patch)
        except JobNotFound:
            return None
        except BackendError as err:
            if isinstance(err.__cause__, api.exc) and err.__cause__.status == 409:
                return False
            raise
        return True
