"""Kubernetes + Kueue backend: one suspended, queued, Indexed batch/v1 Job per gang.

The ``kubernetes`` client is imported lazily (in :meth:`KubernetesBackend._connect`), so
importing this module, and the gateway, works where the library is absent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from adapters.base import (
    Backend,
    BackendError,
    BackendForbidden,
    BackendUnavailable,
    Capacity,
    Feature,
    JobNotFound,
    JobStatus,
    SubmissionRejected,
    SubmitRequest,
    SubmitResult,
    VolumeMount,
    WithJobListing,
    WithOutputStream,
    WithWatch,
    register,
    site_gpu_type,
)

from .capacity import QueueCapacity
from .nodes import NodeCare
from .render import (
    ANN_ATTEMPT,
    ANN_CANCELLED_AT,
    ANN_GATEWAY_ID,
    ANN_USER,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_GATEWAY_ID,
    LABEL_MANAGED,
    MANAGED_VALUE,
    TOMBSTONE_FINALIZER,
    job_name,
    label_value,
    render_job,
)
from .settings import KubernetesSettings
from .state import derive_status, parse_time
from .watch import JobEventStream

JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
POD_JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
POD_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
WORKER_CONTAINER = "worker"  # render.py names the one container so
LOG_CHUNK_BYTES = 64 * 1024
MANAGED_SELECTOR = f"{LABEL_MANAGED}={MANAGED_VALUE}"


@register
class KubernetesBackend(Backend, WithWatch, WithOutputStream, WithJobListing, NodeCare):
    """A Kueue ClusterQueue behind LocalQueues in per-account namespaces.

    Args:
        settings: a :class:`KubernetesSettings`; or pass its fields as keyword arguments.
    """

    name = "kubernetes"
    settings_class = KubernetesSettings
    storage_providers = ("pvc", "nfs", "host_path")

    def __init__(self, settings: KubernetesSettings | None = None, **kwargs: Any):
        self.settings = settings or KubernetesSettings(**kwargs)
        self._lock = threading.Lock()
        self._api: Any = None
        # The ClusterQueue's nodes, capacity, topology levels and fit limits (capacity.py).
        self._queue = QueueCapacity(settings=self.settings, name=self.name, connect=self._connect,
                                    errors=self._errors, raw=self._raw)

    def unsupported(self) -> Mapping[Feature, str]:
        # Node health and drain: nodes.py (NodeCare); a cordon only where the settings allow it.
        return self.node_drain_unsupported()

    def config_problems(self) -> list[tuple[str, str]]:
        """(field, why) when the client configuration cannot be loaded (a kubeconfig that is
        not YAML, lacks the context, names missing certificate files...). Checked at start-up,
        without contacting the cluster, so that the gateway exits with one line instead of
        failing in its threads (issue #14, 3)."""
        if self.settings.kubeconfig is None:
            return []  # in-cluster or the client's default: known only when used
        try:
            from kubernetes import client, config
        except ImportError:  # pragma: no cover - depends on the environment
            return []
        try:
            config.load_kube_config(config_file=self.settings.kubeconfig, context=self.settings.context,
                                    client_configuration=client.Configuration())
        except Exception as exc:  # noqa: BLE001 - ConfigException, YAML errors, missing certificate files
            why = " ".join(str(exc).split()) or type(exc).__name__
            field = "context" if self.settings.context and "context" in why.lower() else "kubeconfig"
            return [(field, f"{self.settings.kubeconfig} cannot be loaded: {why[:300]}")]
        return []

    def storage_problems(self, mount: VolumeMount, accounts: Iterable[str]) -> list[str]:
        """A ``pvc`` storage needs its claim, bound, in each account's namespace that exists
        (jobs of an account whose namespace is missing cannot run here at all), and a claim
        that allows writing when the storage is read-write."""
        if mount.provider != "pvc":
            return []
        api = self._connect()
        problems: list[str] = []
        with self._errors("list namespaces"):
            existing = {n["metadata"]["name"] for n in self._raw(api.core.list_namespace)["items"]}
        for ns in sorted({self.settings.namespace_for(a) for a in accounts} & existing):
            try:
                with self._errors(f"read claim {mount.claim} in {ns}", not_found=f"{ns}/{mount.claim}"):
                    claim = self._raw(api.core.read_namespaced_persistent_volume_claim, mount.claim, ns)
            except JobNotFound:
                problems.append(f"claim {mount.claim!r} does not exist in namespace {ns!r}")
                continue
            phase = (claim.get("status") or {}).get("phase") or "Pending"
            if phase != "Bound":
                problems.append(f"claim {mount.claim!r} in namespace {ns!r} is {phase}, not Bound")
                continue
            modes = set((claim.get("status") or {}).get("accessModes") or claim["spec"].get("accessModes") or ())
            if not mount.read_only and modes and modes <= {"ReadOnlyMany"}:
                problems.append(f"the storage is read-write but claim {mount.claim!r} in namespace {ns!r} is "
                                "ReadOnlyMany")
        return problems

    # ------------------------------------------------------------------ plumbing
    def _connect(self) -> Any:
        with self._lock:
            if self._api is None:
                try:
                    from kubernetes import client, config
                except ImportError as exc:  # pragma: no cover - depends on the environment
                    raise BackendUnavailable("the 'kubernetes' Python package is not installed",
                                             backend=self.name) from exc
                cfg = client.Configuration()
                try:
                    if self.settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                        config.load_incluster_config(client_configuration=cfg)
                    else:
                        config.load_kube_config(config_file=self.settings.kubeconfig,
                                                context=self.settings.context, client_configuration=cfg)
                except Exception as exc:  # ConfigException, missing file, bad YAML
                    raise BackendUnavailable(f"cannot load Kubernetes client configuration: {exc}",
                                             backend=self.name) from exc
                cfg.retries = 1  # fail fast: the gateway retries BackendUnavailable itself
                api_client = client.ApiClient(cfg)
                self._api = type("Apis", (), {})()
                self._api.client = api_client
                self._api.batch = client.BatchV1Api(api_client)
                self._api.core = client.CoreV1Api(api_client)
                self._api.custom = client.CustomObjectsApi(api_client)
                self._api.exc = client.exceptions.ApiException
            return self._api

    @contextlib.contextmanager
    def _errors(self, what: str, *, not_found: str | None = None) -> Iterator[None]:
        """Map kubernetes/urllib3 errors onto the contract's typed errors."""
        api = self._connect()
        try:
            yield
        except BackendError:
            raise
        except api.exc as exc:
            status, message = exc.status or 0, self._server_message(exc)
            if status == 404 and not_found is not None:
                raise JobNotFound(not_found, backend=self.name, detail=message) from exc
            if status in (401, 403):
                raise BackendForbidden(f"{what}: {message}", backend=self.name) from exc
            if status in (400, 422):
                raise SubmissionRejected(f"{what}: {message}", backend=self.name) from exc
            if status == 0 or status == 429 or status >= 500:
                raise BackendUnavailable(f"{what}: {message}", backend=self.name) from exc
            raise BackendError(f"{what}: HTTP {status}: {message}", backend=self.name) from exc
        except Exception as exc:  # urllib3 MaxRetryError/timeouts, OSError, SSL errors
            raise BackendUnavailable(f"{what}: Kubernetes API unreachable ({type(exc).__name__}: {exc})",
                                     backend=self.name) from exc

    @staticmethod
    def _server_message(exc: Any) -> str:
        try:
            return json.loads(exc.body).get("message") or exc.reason
        except (ValueError, TypeError, AttributeError):  # no body, or a body that is not JSON
            return str(exc.reason or exc)

    def _t(self) -> float:
        return self.settings.request_timeout_s

    def _raw(self, fn, *args, **kwargs) -> dict:
        """Call a client method and return the JSON as dicts (skips slow model decoding)."""
        resp = fn(*args, _preload_content=False, _request_timeout=self._t(), **kwargs)
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()  # unpreloaded responses must hand the connection back

    @staticmethod
    def _split(backend_job_id: str) -> tuple[str | None, str]:
        ns, _, name = backend_job_id.rpartition("/")
        return (ns or None), name

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                self._api.client.close()
                self._api = None

    SUBMIT_WINDOW_SLACK_S = 60.0

    def _created_for(self, job: dict, request: SubmitRequest) -> bool:
        """Whether an existing Job is the one the gateway creates for ``request``.

        Labels and annotations can be written by anyone who may create Jobs: adopt only the
        deterministic name in the account's namespace, for the same gateway id and user,
        created after the gateway job existed.
        """
        meta = job["metadata"]
        ann = meta.get("annotations") or {}
        if (meta.get("namespace"), meta.get("name")) != (self.settings.namespace_for(request.account),
                                                         job_name(request.gateway_job_id, request.attempt)):
            return False
        if ann.get(ANN_GATEWAY_ID) != request.gateway_job_id or ann.get(ANN_USER) != request.user:
            return False
        if request.submitted_after is not None:
            created = parse_time(meta.get("creationTimestamp"))
            if created is None or created.timestamp() < request.submitted_after.timestamp() - self.SUBMIT_WINDOW_SLACK_S:
                return False
        return True

    # -------------------------------------------------------------------- submit
    def submit(self, request: SubmitRequest) -> SubmitResult:
        self.check_supported(request)
        if request.workers < 1:
            raise SubmissionRejected("a job needs at least one worker", backend=self.name)
        if request.gpu_type:
            if self._queue.gpu_types is None:
                self.capacity()
            request = dataclasses.replace(request, gpu_type=site_gpu_type(request.gpu_type, self._queue.gpu_types or ()))
        body = render_job(request, self.settings, self._queue.levels())
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        api = self._connect()
        try:
            self._queue.check_fits(request)
        except SubmissionRejected:
            # A job created earlier is still adopted even if the pool shrank since.
            with contextlib.suppress(JobNotFound):
                existing = self._read_job(f"{ns}/{name}")
                if self._created_for(existing, request):
                    return SubmitResult(backend_job_id=f"{ns}/{name}", adopted=True)
            raise
        try:
            with self._errors(f"creating Job {ns}/{name}"):
                self._raw(api.batch.create_namespaced_job, ns, body)
            return SubmitResult(backend_job_id=f"{ns}/{name}")
        except BackendError as err:
            cause = err.__cause__
            if not (isinstance(cause, api.exc) and cause.status == 409):
                raise
        # 409: the deterministic name exists. Adopt it if it carries the same gateway id.
        with self._errors(f"reading Job {ns}/{name}", not_found=f"Job {ns}/{name} vanished during adoption"):
            existing = self._raw(api.batch.read_namespaced_job, name, ns)
        owner = (existing["metadata"].get("annotations") or {}).get(ANN_GATEWAY_ID)
        if owner != request.gateway_job_id:
            raise SubmissionRejected(f"Job {ns}/{name} exists for another gateway job ({owner!r})", backend=self.name)
        if not self._created_for(existing, request):
            raise SubmissionRejected(f"Job {ns}/{name} exists but was not created by the gateway for this job "
                                     f"(other user or created before the job existed)", backend=self.name)
        return SubmitResult(backend_job_id=f"{ns}/{name}", adopted=True)

    # -------------------------------------------------------------------- status
    def _read_job(self, backend_job_id: str) -> dict:
        api = self._connect()
        ns, name = self._split(backend_job_id)
        missing = f"no Job {backend_job_id}"
        if ns is None:
            with self._errors("listing Jobs"):
                items = self._raw(api.batch.list_job_for_all_namespaces, label_selector=MANAGED_SELECTOR,
                                  field_selector=f"metadata.name={name}")["items"]
            if not items:
                raise JobNotFound(missing, backend=self.name)
            return items[0]
        with self._errors(f"reading Job {backend_job_id}", not_found=missing):
            job = self._raw(api.batch.read_namespaced_job, name, ns)
        if (job["metadata"].get("labels") or {}).get(LABEL_MANAGED) != MANAGED_VALUE:
            raise JobNotFound(f"Job {backend_job_id} is not managed by the gateway", backend=self.name)
        return job

    def _workload_for(self, job: dict) -> dict | None:
        """The Workload owned by this Job (ownerReference uid), via Kueue's job-uid label."""
        api = self._connect()
        uid, ns = job["metadata"]["uid"], job["metadata"]["namespace"]
        with self._errors(f"listing Workloads in {ns}"):
            items = self._raw(api.custom.list_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, ns,
                              "workloads", label_selector=f"{JOB_UID_LABEL}={uid}")["items"]
        owned = [w for w in items if any(o.get("uid") == uid for o in w["metadata"].get("ownerReferences") or [])]
        return owned[0] if owned else None

    def _pods_for(self, job: dict) -> list[dict]:
        api = self._connect()
        uid, ns = job["metadata"]["uid"], job["metadata"]["namespace"]
        with self._errors(f"listing pods in {ns}"):
            return self._raw(api.core.list_namespaced_pod, ns, label_selector=f"{POD_JOB_UID_LABEL}={uid}")["items"]

    def _status_of(self, job: dict) -> JobStatus:
        self._sweep_tombstone(job)
        suspended = (job.get("spec") or {}).get("suspend")
        workload = self._workload_for(job)
        pods = [] if suspended and not (job.get("status") or {}).get("active") else self._pods_for(job)
        return derive_status(job, workload, pods)

    def status(self, backend_job_id: str) -> JobStatus:
        return self._status_of(self._read_job(backend_job_id))

    def find_by_gateway_id(self, gateway_job_id: str, *, request: SubmitRequest | None = None) -> JobStatus | None:
        if request is not None:
            try:
                job = self._read_job(f"{self.settings.namespace_for(request.account)}/"
                                     f"{job_name(gateway_job_id, request.attempt)}")
            except JobNotFound:
                return None
            return self._status_of(job) if self._created_for(job, request) else None
        api = self._connect()
        selector = f"{MANAGED_SELECTOR},{LABEL_GATEWAY_ID}={label_value(gateway_job_id)}"
        with self._errors("listing Jobs"):
            items = self._raw(api.batch.list_job_for_all_namespaces, label_selector=selector)["items"]
        for job in items:
            # Only the deterministic name: a label alone is anyone's to write.
            ann = job["metadata"].get("annotations") or {}
            attempt = int(ann[ANN_ATTEMPT]) if str(ann.get(ANN_ATTEMPT, "")).isdigit() else 1
            if (ann.get(ANN_GATEWAY_ID) == gateway_job_id
                    and job["metadata"]["name"] == job_name(gateway_job_id, attempt)):
                return self._status_of(job)
        return None

    def list_gateway_jobs(self) -> Iterable[JobStatus]:
        """Every gateway Job, with three list calls in all (Jobs, Workloads, pods)."""
        api = self._connect()
        with self._errors("listing Jobs"):
            jobs = self._raw(api.batch.list_job_for_all_namespaces, label_selector=MANAGED_SELECTOR)["items"]
        with self._errors("listing Workloads"):
            wls = self._raw(api.custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, "workloads")["items"]
        with self._errors("listing pods"):
            pods = self._raw(api.core.list_pod_for_all_namespaces, label_selector=MANAGED_SELECTOR)["items"]
        wl_by_owner: dict[str, dict] = {}
        for w in wls:
            for o in w["metadata"].get("ownerReferences") or []:
                wl_by_owner[o.get("uid")] = w
        pods_by_job: dict[str, list[dict]] = {}
        for p in pods:
            pods_by_job.setdefault((p["metadata"].get("labels") or {}).get(POD_JOB_UID_LABEL, ""), []).append(p)
        out = []
        for job in jobs:
            self._sweep_tombstone(job)
            uid = job["metadata"]["uid"]
            out.append(derive_status(job, wl_by_owner.get(uid), pods_by_job.get(uid, [])))
        return out

    # -------------------------------------------------------------------- cancel
    def cancel(self, backend_job_id: str) -> None:
        """Mark the Job cancelled, keep it as a tombstone, delete it and its pods.

        The annotation + finalizer keep the Job readable (status() says CANCELLED) for
        ``cancelled_retention_s``; Foreground deletion has the garbage collector remove
        its pods and its Workload (so Kueue releases the quota) first. The adapter drops
        the finalizer when it next sees the Job after the retention.
        """
        api = self._connect()
        try:
            job = self._read_job(backend_job_id)
        except JobNotFound:
            return
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        ann = job["metadata"].get("annotations") or {}
        finished = any(c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
                       for c in (job.get("status") or {}).get("conditions") or [])
        if not ann.get(ANN_CANCELLED_AT) and not finished:
            finalizers = list(job["metadata"].get("finalizers") or [])
            if TOMBSTONE_FINALIZER not in finalizers:
                finalizers.append(TOMBSTONE_FINALIZER)
            patch = {"metadata": {
                "resourceVersion": job["metadata"]["resourceVersion"],  # no lost update
                "finalizers": finalizers,
                "annotations": {ANN_CANCELLED_AT: datetime.now(UTC).isoformat()},
            },
                # Suspending makes Kueue evict the Workload and release its quota now; without
                # it the tombstoned Job kept its GPUs reserved for the whole retention.
                "spec": {"suspend": True}}
            try:
                with self._errors(f"marking Job {ns}/{name} cancelled", not_found="gone"):
                    api.batch.patch_namespaced_job(name, ns, patch, _request_timeout=self._t(),
                                                   _preload_content=False)
            except JobNotFound:
                return
            except BackendError as err:
                if isinstance(err.__cause__, api.exc) and err.__cause__.status == 409:
                    return self.cancel(backend_job_id)  # changed under us: read again
                raise
        if job["metadata"].get("deletionTimestamp"):
            return
        try:
            with self._errors(f"deleting Job {ns}/{name}", not_found="gone"):
                api.batch.delete_namespaced_job(name, ns, propagation_policy="Foreground",
                                                _request_timeout=self._t(), _preload_content=False)
        except JobNotFound:
            return

    def preempt(self, backend_job_id: str, grace_s: float) -> str:
        """Stop the Job as a cancel does: suspended, its pods deleted, each with its
        ``terminationGracePeriodSeconds`` (the gateway's grace period, rendered at submit):
        SIGTERM now, SIGKILL at the deadline, what torchrun and most trainers handle."""
        self.cancel(backend_job_id)
        return (f"Job {backend_job_id} suspended and its pods deleted: SIGTERM now, SIGKILL after their "
                f"terminationGracePeriodSeconds ({grace_s:.0f} s)")

    def _sweep_tombstone(self, job: dict) -> None:
        """Let a cancelled Job go once its retention is over (drop our finalizer)."""
        meta = job["metadata"]
        cancelled = parse_time((meta.get("annotations") or {}).get(ANN_CANCELLED_AT))
        if not cancelled or TOMBSTONE_FINALIZER not in (meta.get("finalizers") or []):
            return
        if (datetime.now(UTC) - cancelled).total_seconds() < self.settings.cancelled_retention_s:
            return
        if not meta.get("deletionTimestamp"):
            return
        api = self._connect()
        # A JSON patch: a strategic-merge patch would merge the finalizer list, not shrink it.
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                 {"op": "replace", "path": "/metadata/finalizers",
                  "value": [f for f in meta.get("finalizers") or [] if f != TOMBSTONE_FINALIZER]}]
        with contextlib.suppress(BackendError):
            with self._errors("releasing a cancelled Job"):
                api.batch.patch_namespaced_job(meta["name"], meta["namespace"], patch,
                                               _request_timeout=self._t(), _preload_content=False)

    # ------------------------------------------------------------------ capacity
    # ------------------------------------------------------------------ capacity
    def capacity(self) -> Capacity:
        """The pool's ClusterQueue, its nodes and their GPUs (capacity.py)."""
        return self._queue.capacity()

    # -------------------------------------------------------------------- output
    def _worker_pod(self, backend_job_id: str, worker: int) -> dict:
        """The newest pod of the Job for completion index ``worker`` (owned by the Job itself)."""
        job = self._read_job(backend_job_id)
        uid, ns = job["metadata"]["uid"], job["metadata"]["namespace"]
        api = self._connect()
        with self._errors(f"listing pods in {ns}"):
            pods = self._raw(api.core.list_namespaced_pod, ns,
                             label_selector=f"{POD_JOB_UID_LABEL}={uid},{POD_INDEX_LABEL}={int(worker)}")["items"]
        # Only pods the Job controls: a label is anyone's to write in the namespace.
        pods = [p for p in pods if any(o.get("uid") == uid and o.get("controller")
                                       for o in p["metadata"].get("ownerReferences") or [])]
        if not pods:
            raise JobNotFound(f"no pod for worker {worker} of Job {backend_job_id}", backend=self.name)
        return max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    def stream_output(self, backend_job_id: str, worker: int, *, tail_lines: int | None = None,
                      follow: bool = False) -> Iterator[bytes]:
        """The worker pod's log (``read_namespaced_pod_log``), in chunks of at most 64 KiB.

        The pod is looked up before the first chunk, so a missing pod raises at once.
        """
        pod = self._worker_pod(backend_job_id, worker)
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = WORKER_CONTAINER if WORKER_CONTAINER in containers else (containers[0] if containers else None)
        api = self._connect()
        kwargs: dict[str, Any] = {"container": container, "follow": bool(follow)}
        if tail_lines is not None:
            kwargs["tail_lines"] = int(tail_lines)
        # Following waits for output as long as the worker runs: only connecting is timed.
        timeout = (self._t(), None) if follow else self._t()
        with self._errors(f"reading the log of pod {ns}/{name}", not_found=f"pod {ns}/{name} is gone"):
            resp = api.core.read_namespaced_pod_log(name, ns, _preload_content=False,
                                                    _request_timeout=timeout, **kwargs)
        return self._log_chunks(resp, f"{ns}/{name}")

    def _log_chunks(self, resp: Any, what: str) -> Iterator[bytes]:
        try:
            with self._errors(f"reading the log of pod {what}"):
                for chunk in resp.stream(LOG_CHUNK_BYTES, decode_content=True):
                    if chunk:
                        yield chunk
        finally:
            resp.release_conn()

    # --------------------------------------------------------------------- watch
    def watch_events(self, stop_event: threading.Event, since_resource_version: str | None = None,
                     interested=None):
        """Stream JobStatus changes of gateway Jobs (see :class:`watch.JobEventStream`)."""
        return JobEventStream(self, stop_event, since_resource_version, interested)
