"""Plain settings for the Kubernetes+Kueue backend (no gateway imports)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

from adapters.envfile import read_env_file

ENV_PREFIX = "ISTHMUS_KUBE_"
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclasses.dataclass(frozen=True)
class KubernetesSettings:
    """How the adapter reaches the cluster and maps gateway concepts onto Kueue.

    Attributes:
        kubeconfig: path of a kubeconfig file; None means in-cluster config when running
            in a pod, else the client's default kubeconfig.
        context: kubeconfig context; None means its current-context.
        namespace_template: namespace of an account's Jobs, ``{account}`` substituted.
        namespaces: explicit account -> namespace overrides (win over the template).
        local_queue: the LocalQueue name in every account namespace.
        cluster_queue: the ClusterQueue behind those LocalQueues (capacity, fit checks).
        priority_classes: the WorkloadPriorityClasses this site offers, by rank (rank ->
            class). A job's class is its account's ``priority_class`` (set by the gateway's
            administrators), else ``default_priority_class``, else the class of rank 0 (or
            the lowest rank). A user's job ``priority`` never picks a class: the classes are
            cluster-wide and decide whom the shared ClusterQueue preempts. A class not
            listed here is refused. Empty: any class is accepted, and jobs without one get
            no priority label.
        default_priority_class: class of the jobs of accounts without one (see above).
        uid_map: POSIX user -> uid; a mapped user's pods run as that uid (``runAsUser``).
            Every pod runs with ``runAsNonRoot`` (an unmapped user's image must name a
            non-root USER, or the kubelet refuses to start it).
        automount_service_account_token: mount the namespace's ServiceAccount token into
            the pods. Off: a job has no business calling the Kubernetes API as the namespace.
        seccomp_profile: the pods' seccomp profile type (``RuntimeDefault``; None: the
            cluster's default).
        backoff_limit: Job backoffLimit; 0 = one failed worker fails the gang.
        request_timeout_s: per API request (connect+read).
        default_image: image when the request has none (kwok runs no containers).
        helper_image: the image of the init container that makes a job's per-account and
            checkpoint directories as the job's user (render.render_mkdir); it sees whole
            volumes, so it is the site's, never the user's. Needs ``sh`` and ``mkdir``.
            None: ``default_image``.
        ttl_after_finished_s: finished Jobs are garbage-collected after this long.
        cancelled_retention_s: a cancelled Job stays visible (as CANCELLED) this long.
        gpu_resource: the extended resource name of a GPU.
        gpu_type_label: node label matched against SubmitRequest.gpu_type.
        drain_suspect_nodes: the gateway cordons a node of the pool its node-health rule finds
            suspect (``spec.unschedulable: true`` plus the annotation ``isthmus.io/drained``
            with the reason; running pods are left alone) and uncordons it when an admin
            clears it, but only a node it cordoned itself (docs/kubernetes.md, "Node health").
            Needs ``patch`` on nodes for the gateway's identity. Off: the gateway only keeps
            its own gangs off the node (a required node affinity).
    """

    kubeconfig: str | None = None
    context: str | None = None
    namespace_template: str = "isthmus-{account}"
    namespaces: Mapping[str, str] = dataclasses.field(default_factory=dict)
    local_queue: str = "isthmus"
    cluster_queue: str = "isthmus-gpu"
    priority_classes: Mapping[int, str] = dataclasses.field(
        default_factory=lambda: {-1: "isthmus-low", 0: "isthmus-normal", 1: "isthmus-high"}
    )
    default_priority_class: str | None = None
    uid_map: Mapping[str, int] = dataclasses.field(default_factory=dict)
    automount_service_account_token: bool = False
    seccomp_profile: str | None = "RuntimeDefault"
    backoff_limit: int = 0
    request_timeout_s: float = 10.0
    default_image: str = "isthmus/placeholder:latest"
    helper_image: str | None = None
    ttl_after_finished_s: int | None = 86400
    cancelled_retention_s: int = 300
    gpu_resource: str = "nvidia.com/gpu"
    gpu_type_label: str = "nvidia.com/gpu.product"
    drain_suspect_nodes: bool = False

    def namespace_for(self, account: str) -> str:
        return self.namespaces.get(account) or self.namespace_template.format(account=account)

    def workload_priority_class(self, account_class: str | None) -> str | None:
        """The WorkloadPriorityClass of a job whose account has ``account_class`` (admin-set).

        Raises:
            ValueError: the class is not one this site offers (``priority_classes``).
        """
        chosen = account_class or self.default_priority_class or self.priority_class_for(0)
        if chosen and self.priority_classes and chosen not in self.priority_classes.values():
            raise ValueError(f"priority class {chosen!r} is not one this cluster offers "
                             f"({', '.join(sorted(set(self.priority_classes.values())))})")
        return chosen

    def priority_class_for(self, priority: int) -> str | None:
        if not self.priority_classes:
            return None
        thresholds = sorted(self.priority_classes)
        chosen = thresholds[0]
        for t in thresholds:
            if t <= priority:
                chosen = t
        return self.priority_classes[chosen]

    def problems(self) -> list[tuple[str, str]]:
        """(field, why) for settings that cannot work, checked without contacting the cluster."""
        out: list[tuple[str, str]] = []
        if self.kubeconfig is not None:
            p = Path(self.kubeconfig)
            if not p.is_file():
                out.append(("kubeconfig", f"no such file: {self.kubeconfig}"))
            elif not os.access(p, os.R_OK):
                out.append(("kubeconfig", f"not readable by this user: {self.kubeconfig}"))
        for name in ("cluster_queue", "local_queue"):
            if not _DNS_NAME.fullmatch(getattr(self, name) or ""):
                out.append((name, f"not a Kubernetes object name: {getattr(self, name)!r}"))
        try:
            example = self.namespace_template.format(account="team-a")
        except (KeyError, IndexError, ValueError):
            out.append(("namespace_template", f"only {{account}} may be substituted: {self.namespace_template!r}"))
        else:
            if not _DNS_NAME.fullmatch(example):
                out.append(("namespace_template", f"gives namespace {example!r}, not a valid name"))
        if self.request_timeout_s <= 0:
            out.append(("request_timeout_s", "must be > 0"))
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, env_file: str | Path | None = None,
                 **overrides) -> KubernetesSettings:
        """Settings from ``ISTHMUS_KUBE_*`` variables (and KUBECONFIG), optionally read
        from a KEY=VALUE file such as the one ``stack/kube/up.sh`` writes."""
        values: dict[str, str] = {}
        if env_file is not None:
            values.update(read_env_file(env_file))
        values.update(env if env is not None else os.environ)
        kw: dict = {}
        if values.get("KUBECONFIG"):
            kw["kubeconfig"] = values["KUBECONFIG"]
        simple = {
            "CONTEXT": ("context", str), "NAMESPACE_TEMPLATE": ("namespace_template", str),
            "LOCAL_QUEUE": ("local_queue", str), "CLUSTER_QUEUE": ("cluster_queue", str),
            "BACKOFF_LIMIT": ("backoff_limit", int), "REQUEST_TIMEOUT_S": ("request_timeout_s", float),
            "DEFAULT_IMAGE": ("default_image", str), "HELPER_IMAGE": ("helper_image", str),
            "CANCELLED_RETENTION_S": ("cancelled_retention_s", int),
            "DEFAULT_PRIORITY_CLASS": ("default_priority_class", str),
            "AUTOMOUNT_SERVICE_ACCOUNT_TOKEN": ("automount_service_account_token",
                                                lambda v: v.strip().lower() in ("1", "true", "yes")),
            "SECCOMP_PROFILE": ("seccomp_profile", lambda v: None if v.strip().lower() == "none" else v.strip()),
            "DRAIN_SUSPECT_NODES": ("drain_suspect_nodes", lambda v: v.strip().lower() in ("1", "true", "yes")),
        }
        for key, (field, conv) in simple.items():
            if values.get(ENV_PREFIX + key):
                kw[field] = conv(values[ENV_PREFIX + key])
        if values.get(ENV_PREFIX + "PRIORITY_CLASSES"):  # "-1:low,0:normal,1:high"
            kw["priority_classes"] = {
                int(k): v for k, v in (p.split(":", 1) for p in values[ENV_PREFIX + "PRIORITY_CLASSES"].split(","))
            }
        if values.get(ENV_PREFIX + "UID_MAP"):  # "alice=1001,bob=1002"
            pairs = (p.split("=", 1) for p in values[ENV_PREFIX + "UID_MAP"].split(","))
            kw["uid_map"] = {u.strip(): int(n) for u, n in pairs}
        if values.get(ENV_PREFIX + "NAMESPACE_MAP"):  # "acct=ns,acct2=ns2"
            kw["namespaces"] = dict(p.split("=", 1) for p in values[ENV_PREFIX + "NAMESPACE_MAP"].split(","))
        kw.update(overrides)
        return cls(**kw)
