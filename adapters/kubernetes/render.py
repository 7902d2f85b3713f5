"""The batch/v1 Job the adapter creates for one gateway gang (pure functions)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from adapters.base import SubmissionRejected, SubmitRequest

from .settings import KubernetesSettings

GROUP = "isthmus.io"
LABEL_MANAGED = f"{GROUP}/managed-by"
MANAGED_VALUE = "isthmus-gateway"
LABEL_GATEWAY_ID = f"{GROUP}/gateway-job-id"
LABEL_ACCOUNT = f"{GROUP}/account"
LABEL_USER = f"{GROUP}/user"
ANN_GATEWAY_ID = f"{GROUP}/gateway-job-id"
ANN_ACCOUNT = f"{GROUP}/account"
ANN_USER = f"{GROUP}/user"
ANN_NAME = f"{GROUP}/job-name"
ANN_WORKERS = f"{GROUP}/workers"
ANN_GPUS_PER_WORKER = f"{GROUP}/gpus-per-worker"
ANN_CANCELLED_AT = f"{GROUP}/cancelled-at"
ANN_ATTEMPT = f"{GROUP}/attempt"
TOMBSTONE_FINALIZER = f"{GROUP}/cancel-tombstone"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"  # the Workload API the adapter reads
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Kueue's Topology Aware Scheduling: a PodSet's wish for one domain of a level (a node label).
TAS_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
TAS_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
HOSTNAME_LABEL = "kubernetes.io/hostname"
RESERVED_PREFIXES = (f"{GROUP}/managed-by", f"{GROUP}/gateway-job-id", f"{GROUP}/account",
                     f"{GROUP}/user", "kueue.x-k8s.io/", "batch.kubernetes.io/")
# Set by the Job controller on its pods (legacy spellings of batch.kubernetes.io/*).
RESERVED_KEYS = ("job-name", "controller-uid")

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# A Node's name: a DNS subdomain (RFC 1123), at most 253 characters; matched whole (fullmatch).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


_LEVEL_WORD = re.compile(r"^[a-z][a-z0-9-]{0,30}$")  # gateway/jobs/schemas.py TOPOLOGY_LEVEL_RE


def level_word(node_label: str) -> str:
    """The pool's word for a Topology level (docs/planning.md, "Topology"): ``host`` for
    ``kubernetes.io/hostname``, else the label's name without its prefix and without a leading
    ``topology-`` (``cloud.provider.com/topology-rack`` -> ``rack``, ``example.com/block`` ->
    ``block``). "" when that is not a level word (lower-case letters, digits, dashes)."""
    if node_label == HOSTNAME_LABEL:
        return "host"
    word = node_label.rpartition("/")[2].lower()
    word = word.removeprefix("topology-").removeprefix("topology.")
    return word if _LEVEL_WORD.fullmatch(word) else ""


def topology_levels(node_labels: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(word, node label) of each level of a Kueue Topology, highest first; a label without
    a usable word, or whose word an earlier level has, is left out."""
    out: dict[str, str] = {}
    for label in node_labels:
        word = level_word(str(label))
        if word and word not in out:
            out[word] = str(label)
    return tuple(out.items())


def _digest(value: str, n: int = 10) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:n]


def label_value(value: str) -> str:
    """``value`` if it is a valid label value, else a stable digest of it."""
    if len(value) <= 63 and _LABEL_VALUE.fullmatch(value):
        return value
    return "h-" + _digest(value, 40)


def job_name(gateway_job_id: str, attempt: int = 1) -> str:
    """Deterministic DNS-1123 Job name: a re-submit hits 409 and adopts, never duplicates.

    The digest keeps ids that differ only in case or punctuation apart. Each gateway attempt
    at a job (a retry, docs/recovery.md) is its own Job: ``-a<n>`` from the second on.
    """
    key = gateway_job_id if attempt <= 1 else f"{gateway_job_id}/{attempt}"
    tail = "" if attempt <= 1 else f"-a{attempt}"
    slug = re.sub(r"[^a-z0-9-]+", "-", gateway_job_id.lower()).strip("-")[:36 - len(tail)].strip("-")
    return f"isthmus-{slug}{tail}-{_digest(key, 8)}" if slug else f"isthmus-{_digest(key, 16)}"


def volume_name(storage: str) -> str:
    """The pod volume of one storage (a storage name is a DNS label of at most 32)."""
    return f"storage-{storage}"


def render_mounts(request: SubmitRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts): one volume per storage, one mount per directory the job sees,
    with the account's or the checkpoint's directory as ``subPath`` (docs/storage.md). The
    kubelet creates a missing ``subPath`` directory."""
    volumes: dict[str, dict[str, Any]] = {}
    mounts: list[dict[str, Any]] = []
    for m in request.mounts:
        name = volume_name(m.storage)
        if name not in volumes:
            # The volume is read-only unless some mount of it writes: a read-only storage is
            # never mounted writable, whatever the claim allows.
            writable = any(not o.read_only for o in request.mounts if o.storage == m.storage)
            if m.provider == "pvc":
                source = {"persistentVolumeClaim": {"claimName": m.claim, "readOnly": not writable}}
            elif m.provider == "nfs":
                source = {"nfs": {"server": m.server, "path": m.source_path, "readOnly": not writable}}
            elif m.provider == "host_path":
                source = {"hostPath": {"path": m.source_path, "type": "Directory"}}
            else:
                raise SubmissionRejected(f"storage {m.storage!r}: a Kubernetes pool mounts a volume (pvc, nfs or "
                                         f"host_path), not {m.provider!r}", backend="kubernetes")
            volumes[name] = {"name": name, **source}
        mount: dict[str, Any] = {"name": name, "mountPath": m.path, "readOnly": m.read_only}
        if m.sub_path:
            mount["subPath"] = m.sub_path
        mounts.append(mount)
    return list(volumes.values()), mounts


MKDIR_CONTAINER = "isthmus-mkdir"
MKDIR_ROOT = "/isthmus-storage"  # where the helper sees each volume's root
# The helper's fixed script (the directories are its arguments; no shell string is built from
# a request). Before it makes them, it refuses a directory any component of which, below the
# volume's root, is a symbolic link: a job of the account could have replaced its checkpoint
# directory with a link into another account's, and the kubelet follows a subPath's links
# that stay inside the volume (issue #45; docs/storage.md). Exit 66, as a Slurm job's check.
MKDIR_SCRIPT = (
    'umask 077\n'
    'for p do\n'
    '  rest=${p#' + MKDIR_ROOT + '/}; cur=' + MKDIR_ROOT + '/${rest%%/*}; rest=${rest#*/}\n'
    '  while [ -n "$rest" ]; do\n'
    '    cur=$cur/${rest%%/*}\n'
    '    case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac\n'
    '    if [ -L "$cur" ]; then echo "isthmus: $cur is a symbolic link: a job\'s directories are never'
    ' links" >&2; exit 66; fi\n'
    '  done\n'
    'done\n'
    'exec mkdir -p -- "$@"\n')


def render_mkdir(request: SubmitRequest, settings: KubernetesSettings, uid: int | None,
                 container: dict[str, Any]) -> dict[str, Any] | None:
    """The init container that makes the job's per-account and checkpoint directories before
    its worker starts: as the job's user with ``umask 077`` (mode 0700, owned by that user),
    as a Slurm job's script does. Left to the kubelet, a missing ``subPath`` is made as root
    with the mode of the volume's root: on a root like ``/tmp`` (1777), a directory that any
    user of a Slurm cluster sharing the file system could read (docs/storage.md, "Tenancy").

    It sees each volume's whole root, so it runs the site's image (``helper_image``, else
    ``default_image``), never the user's, with a fixed command and the directories as
    arguments (no shell string is built). None when no directory is to be made, or when the
    user has no uid here (``uid_map``): then the kubelet makes them.
    """
    dirs = [m for m in request.mounts if m.create and m.sub_path]
    if not dirs or uid is None:
        return None
    volumes = {m.storage: {"name": volume_name(m.storage), "mountPath": f"{MKDIR_ROOT}/{m.storage}"} for m in dirs}
    paths = list(dict.fromkeys(f"{MKDIR_ROOT}/{m.storage}/{m.sub_path}" for m in dirs))
    return {
        "name": MKDIR_CONTAINER,
        "image": settings.helper_image or settings.default_image,
        "command": ["sh", "-c", MKDIR_SCRIPT, MKDIR_CONTAINER, *paths],
        "volumeMounts": list(volumes.values()),
        # The worker's: the pod's requests stay the worker's (an init container's count only
        # as a maximum), and its QoS class with them.
        "resources": container["resources"],
        "securityContext": dict(container["securityContext"]),
    }


def node_name(name: str) -> str:
    """``name`` when it can be a Kubernetes Node's name (a DNS subdomain of at most 253
    characters), else SubmissionRejected naming it: a name goes into a node affinity or an
    API path only once checked."""
    if isinstance(name, str) and len(name) <= 253 and _NODE_NAME.fullmatch(name):
        return name
    raise SubmissionRejected(f"not a Kubernetes node name: {str(name)[:300]!r}", backend="kubernetes")


def add_node_exclusion(pod_spec: dict[str, Any], nodes: Iterable[str]) -> None:
    """Keep the pods of ``pod_spec`` off ``nodes`` (``SubmitRequest.exclude_nodes``): a required
    node affinity ``kubernetes.io/hostname NotIn [...]``, added to every term already there
    (the terms are alternatives, so each must exclude them), else as the one term. The
    scheduler honours it; Kueue's flavor assignment ignores a term on a key its flavors do not
    label, so the gang is still admitted on the flavor and placed on the other nodes."""
    names = sorted({node_name(n) for n in nodes})
    if not names:
        return
    rule = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": names}
    required = (pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}))
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(rule, values=list(names)))


def tas_annotation(request: SubmitRequest, levels: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The pod template's Topology Aware Scheduling annotation for the request (see render_job)."""
    t = request.topology
    if t is None:
        return {TAS_PREFERRED: levels[0][1]} if levels else {}
    labels = dict(levels)
    if t.level not in labels:
        have = ", ".join(w for w, _ in levels) or "none"
        raise SubmissionRejected(f"this Kueue pool has no topology level {t.level!r} (levels: {have})",
                                 backend="kubernetes")
    return {TAS_REQUIRED if t.required else TAS_PREFERRED: labels[t.level]}


def render_job(request: SubmitRequest, settings: KubernetesSettings,
               levels: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The Job body: suspended, queued on the account's LocalQueue, Indexed, one pod per worker.

    ``levels``: the pool's Kueue Topology levels, highest first, as (word, node label)
    (capacity.py ``QueueCapacity.flavors``). A gang's ``topology`` wish becomes the Topology Aware Scheduling
    annotation of its pod template with the level's node label; with no wish, a pool that has
    levels packs the gang as tightly as it can: preferred at the highest level.
    """
    # The gateway refuses these keys (422); an adapter used directly still never lets a
    # request's label pose as the gateway's, Kueue's or the Job controller's.
    labels = {k: v for k, v in request.labels.items()
              if not k.startswith(RESERVED_PREFIXES) and k not in RESERVED_KEYS}
    labels.update({
        LABEL_MANAGED: MANAGED_VALUE,
        LABEL_GATEWAY_ID: label_value(request.gateway_job_id),
        LABEL_ACCOUNT: label_value(request.account),
        LABEL_USER: label_value(request.user),
    })
    job_labels = dict(labels)
    job_labels[KUEUE_QUEUE_LABEL] = settings.local_queue
    # The account's class (an administrator's setting), never one the user's priority picks.
    try:
        priority_class = settings.workload_priority_class(request.priority_class)
    except ValueError as exc:
        raise SubmissionRejected(str(exc), backend="kubernetes") from exc
    if priority_class:
        job_labels[KUEUE_PRIORITY_LABEL] = priority_class
    annotations = {
        ANN_GATEWAY_ID: request.gateway_job_id,
        ANN_ACCOUNT: request.account,
        ANN_USER: request.user,
        ANN_NAME: request.name,
        ANN_WORKERS: str(request.workers),
        ANN_GPUS_PER_WORKER: str(request.gpus_per_worker),
        ANN_ATTEMPT: str(request.attempt),
    }
    resources: dict[str, str] = {
        "cpu": str(request.cpus_per_worker),
        "memory": f"{request.memory_mib_per_worker}Mi",
    }
    if request.gpus_per_worker:
        resources[settings.gpu_resource] = str(request.gpus_per_worker)
    env = [{"name": k, "value": str(v)} for k, v in request.env.items()]
    env += [
        {"name": "ISTHMUS_GATEWAY_JOB_ID", "value": request.gateway_job_id},
        {"name": "ISTHMUS_WORKERS", "value": str(request.workers)},
    ]
    pod_security: dict[str, Any] = {"runAsNonRoot": True}
    uid = settings.uid_map.get(request.user)
    if uid is not None:
        pod_security["runAsUser"] = int(uid)
    if settings.seccomp_profile:
        pod_security["seccompProfile"] = {"type": settings.seccomp_profile}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": bool(settings.automount_service_account_token),
        "securityContext": pod_security,
        "containers": [{
            "name": "worker",
            "image": request.image or settings.default_image,
            "command": list(request.command),  # argv, no shell
            "env": env,
            # requests == limits: GPUs must be, and a gang worker should not be throttled.
            "resources": {"requests": resources, "limits": dict(resources)},
            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                                "capabilities": {"drop": ["ALL"]}},
        }],
    }
    if request.preempt_grace_s:
        # A preemption deletes the pods (docs/recovery.md): SIGTERM, then SIGKILL this much later.
        pod_spec["terminationGracePeriodSeconds"] = int(request.preempt_grace_s)
    if request.mounts:
        volumes, volume_mounts = render_mounts(request)
        pod_spec["volumes"] = volumes
        pod_spec["containers"][0]["volumeMounts"] = volume_mounts
        mkdir = render_mkdir(request, settings, uid, pod_spec["containers"][0])
        if mkdir is not None:
            pod_spec["initContainers"] = [mkdir]
    if request.gpu_type:
        pod_spec["nodeSelector"] = {settings.gpu_type_label: request.gpu_type}
    if request.exclude_nodes:
        # Required: a retry never lands on the node that failed the last attempt, nor on one
        # the gateway has quarantined (docs/recovery.md, "Node health"). A nodeSelector (gpu_type)
        # still applies: a pod must satisfy both.
        add_node_exclusion(pod_spec, request.exclude_nodes)
    spec: dict[str, Any] = {
        "suspend": True,  # Kueue unsuspends on admission; the webhooks are not relied on
        "completionMode": "Indexed",
        "completions": request.workers,
        "parallelism": request.workers,
        "backoffLimit": settings.backoff_limit,
        # A worker its node took down fails the Job at once, and the Job's own condition says so
        # (reason PodFailurePolicy, naming DisruptionTarget): the pod of a deleted node is gone
        # by the time anyone looks, the Job's status is not (docs/recovery.md).
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onPodConditions": [
            {"type": "DisruptionTarget", "status": "True"}]}]},
        "template": {"metadata": {"labels": labels, "annotations": dict(annotations)}, "spec": pod_spec},
    }
    tas = tas_annotation(request, levels)
    if tas:
        spec["template"]["metadata"]["annotations"].update(tas)
    if request.time_limit_s and request.time_limit_s > 0:
        # Counts from the (last) unsuspension, i.e. admission; a queued job does not age.
        spec["activeDeadlineSeconds"] = int(request.time_limit_s)
    if settings.ttl_after_finished_s is not None:
        spec["ttlSecondsAfterFinished"] = settings.ttl_after_finished_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(request.gateway_job_id, request.attempt),
            "namespace": settings.namespace_for(request.account),
            "labels": job_labels,
            "annotations": annotations,
        },
        "spec": spec,
    }
