"""Gateways wired to the real local backends, driven round by round."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, Gateway, fresh_database, missing_system, read_env_file


def slurm_env(version: str = "22.05") -> dict[str, str]:
    path = REPO / ".stack" / f"slurm-{version}" / "env"
    if not path.exists():
        missing_system(f"Slurm {version} cluster not running (run stack/slurm/up.sh {version})")
    return read_env_file(path)


def kube_env() -> dict[str, str]:
    path = REPO / ".stack" / "kube" / "env"
    if not path.exists():
        missing_system("Kubernetes control plane not running (run stack/kube/up.sh)")
    return read_env_file(path)


def slurm_backend_options(env: dict[str, str], transport: str = "rest") -> dict:
    options = {"transport": transport, "rest_url": env["SLURMRESTD_URL"], "jwt_key_path": env["SLURM_JWT_KEY"],
               "partition": env["SLURM_PARTITION"], "work_dir": env["SLURM_WORK_DIR"], "slurm_conf": env["SLURM_CONF"],
               "cli_prefix": env.get("SLURM_CLI_PREFIX", "")}
    if env.get("SLURM_BIN_DIR"):  # a Slurm built into a prefix (25.11, 26.05): its commands, its srun in the job
        bin_dir = env["SLURM_BIN_DIR"]
        options.update(slurm_bin_dir=bin_dir, job_environment={"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
                                                               "SLURM_CONF": env["SLURM_CONF"]})
    return options


def kube_backend_options(env: dict[str, str]) -> dict:
    return {"kubeconfig": env["KUBECONFIG"], "cluster_queue": env["ISTHMUS_KUBE_CLUSTER_QUEUE"],
            "local_queue": env["ISTHMUS_KUBE_LOCAL_QUEUE"],
            "namespace_template": env.get("ISTHMUS_KUBE_NAMESPACE_TEMPLATE", "isthmus-{account}"),
            "request_timeout_s": 15.0}


@contextlib.contextmanager
def wired_gateway(database_url: str, dev_key_path, backends: dict, *, fresh: bool = True, **overrides):
    """A gateway app on ``database_url`` whose dispatcher the test drives. ``fresh``: start on a
    fresh copy of the migrated schema (False: a second replica on the same database)."""
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    settings = Settings(**{"database_url": database_url, "dev_mode": True, "dev_key_path": dev_key_path,
                           "dev_accounts": "team-a,team-b", "backends": json.dumps(backends),
                           "dispatch_in_serve": False, "retry_backoff_base_s": 0.2, "retry_backoff_max_s": 1.0,
                           "capacity_ttl_s": 0, **overrides})
    if fresh:
        fresh_database(database_url)
    app = create_app(settings)
    with TestClient(app) as client:
        try:
            yield Gateway(client=client, app=app, settings=settings, issuer=build_dev_issuer(settings))
        finally:
            _cancel_leftovers(app)


def _cancel_leftovers(app) -> None:
    """A failed test must not leave jobs holding the shared clusters' nodes or quota."""
    from sqlalchemy import select

    from gateway.models.jobs import Job

    with app.state.sessionmaker() as s:
        live = s.execute(select(Job.pool, Job.backend_job_id).where(
            Job.state.notin_(["succeeded", "failed", "cancelled"]), Job.backend_job_id.isnot(None))).all()
    for pool, backend_job_id in live:
        try:
            app.state.backends[pool].cancel(backend_job_id)
        except Exception:  # noqa: BLE001, S110 - best effort clean-up
            pass


def drive_until(gw: Gateway, predicate, timeout_s: float = 120, interval_s: float = 0.5):
    """Run dispatcher rounds until ``predicate()`` is truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        gw.app.state.dispatcher.run_once()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the gateway to get there")
        time.sleep(interval_s)


def job_state(gw: Gateway, job_id: str, *states: str, headers=None):
    job = gw.client.get(f"/v1/jobs/{job_id}", headers=headers or gw.headers(admin=True, user="root", groups=())).json()
    return job if job["state"] in states else None


@pytest.fixture(scope="module")
def slurm_cluster(request):
    """The env of the Slurm cluster the module is marked with: ``pytest.mark.slurm("24.11")``
    (the first version named; 22.05 when none is). The marker is also what the module holds
    while it runs (tests/lanes.py), so spreading modules over versions spreads the work."""
    marker = request.node.get_closest_marker("slurm")
    return slurm_env(str(marker.args[0]) if marker and marker.args else "22.05")


@pytest.fixture(scope="module")
def kube():
    return kube_env()


# kwok runs no containers: these labels pick its stages (stack/kube/kwok-stages.yaml).
KWOK_RUN_FOR = "isthmus.io/fake-run-for"
KWOK_EXIT_CODE = "isthmus.io/fake-exit-code"


# ------------------------------------------------------------------ container output on kwok
# kwok runs no containers: the stand-in for a worker's container output is a file a test
# writes (CRI log format) and names in a kwok ``Logs`` object for the worker's pod; kwok's
# kubelet server then serves it to the apiserver's ``pods/log`` (stack/kube/kwok.sh,
# docs/logs.md). Shared by tests/dispatch/test_kube_logs.py and tests/ui.

INDEX = "batch.kubernetes.io/job-completion-index"
CREATED: list[tuple[str, str, Path]] = []  # (namespace, Logs name, output file)


@pytest.fixture
def k8s(kube):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kube["KUBECONFIG"], client_configuration=cfg)
    api = client.ApiClient(cfg)
    custom = client.CustomObjectsApi(api)
    yield client.CoreV1Api(api), custom, client.BatchV1Api(api)
    for ns, name, path in CREATED:  # the stand-ins go with the test
        with contextlib.suppress(client.exceptions.ApiException):
            custom.delete_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", ns, "logs", name)
        path.unlink(missing_ok=True)
    CREATED.clear()
    api.close()


def container_output_dir(kube) -> Path:
    return Path(kube.get("ISTHMUS_KUBE_CONTAINER_OUTPUT_DIR")
                or Path(kube["ISTHMUS_KUBE_STATE_DIR"]) / "container-output")


def worker_pods(core, ns: str, job_name: str) -> dict[int, str]:
    pods = core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={job_name}").items
    return {int(p.metadata.labels[INDEX]): p.metadata.name for p in pods}


def fake_container_output(kube, k8s, backend_job_id: str, workers: int, lines) -> None:
    """Write each worker's stand-in output file and point kwok at it (a Logs object per pod)."""
    core, custom, _ = k8s
    ns, name = backend_job_id.split("/")
    pods: dict[int, str] = {}
    deadline = time.monotonic() + 30
    while len(pods) < workers:
        assert time.monotonic() < deadline, f"pods of {backend_job_id}: {pods}"
        pods = worker_pods(core, ns, name)
        time.sleep(0.2)
    out = container_output_dir(kube)
    out.mkdir(parents=True, exist_ok=True)
    for worker, pod in pods.items():
        path = out / f"{pod}.log"
        path.write_text("".join(f"2026-01-01T00:00:0{i}.000000000Z stdout F {line}\n"
                                for i, line in enumerate(lines(worker))))
        custom.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", ns, "logs", _logs_object(ns, pod, path))
        CREATED.append((ns, pod, path))
    # kwok learns of a Logs object through its watch, and answers pods/log from a list it caches
    # under its informer's last resourceVersion (kwok v0.8.0 pkg/config/resources/cache.go),
    # which moves when an event is queued, a moment before the informer's store holds it: a
    # read in that moment caches the list without the object until the next Logs event. So an
    # unserved stand-in is touched (an annotation: an event) and read again a second later.
    # (CI 877d2df's three failures here had another cause: a fake node whose address kwok had
    # overwritten at start-up, so the apiserver asked elsewhere; stack/kube/up.sh, "readiness".
    # The diagnosis below names the node's address.)
    for worker, pod in pods.items():
        want, seen = "".join(f"{line}\n" for line in lines(worker)), None
        started, touches = time.monotonic(), 0
        while True:
            try:
                seen = core.read_namespaced_pod_log(pod, ns, container="worker")
            except Exception as exc:  # noqa: BLE001  (kwok's cached list lacks the object)
                seen = f"{exc!r} {getattr(exc, 'status', '')} {str(getattr(exc, 'body', ''))[:300]}"
            if seen == want:
                break
            assert time.monotonic() - started < 40, (
                f"kwok never served the stand-in log of {ns}/{pod} ({touches} touches): {seen!r}; "
                f"{_kwok_diagnosis(kube, core, ns, pod)}")
            touches += 1
            custom.patch_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", ns, "logs", pod, {
                "metadata": {"annotations": {"isthmus.io/touch": str(touches)}}})
            time.sleep(1.0)


def _kwok_diagnosis(kube, core, ns: str, pod: str) -> str:
    """What a failed stand-in log read needs to be understood: the pod's node (a fake one?),
    which process answers on kwok's port (the kwok this stack started?), kwok's last words.
    (CI 877d2df failed three tests here with 404s for 40 s: a fake node's InternalIP was kwok's
    10.243.0.1, not the 127.0.0.1 its server listens on.)"""
    words = []
    with contextlib.suppress(Exception):
        p = core.read_namespaced_pod(pod, ns)
        words.append(f"pod on node {p.spec.node_name!r}, phase {p.status.phase}")
        node = core.read_node(p.spec.node_name)
        words.append(f"the node's addresses {[(a.type, a.address) for a in node.status.addresses]} "
                     f"port {node.status.daemon_endpoints.kubelet_endpoint.port} (kwok's server: 127.0.0.1)")
    state = Path(kube["ISTHMUS_KUBE_STATE_DIR"])
    with contextlib.suppress(Exception):
        pid = (state / "pids" / "kwok.pid").read_text().strip()
        alive = Path(f"/proc/{pid}").exists()
        port = kube.get("ISTHMUS_KUBE_KWOK_PORT", "16447")
        listeners = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
        words.append(f"this stack's kwok pid {pid} ({'alive' if alive else 'gone'}); on port {port}: {listeners!r}")
    with contextlib.suppress(Exception):
        lines = (state / "logs" / "kwok.log").read_text(errors="replace").splitlines()
        notable = [line[:300] for line in lines if '"level":"INFO"' not in line or "log" in line.lower()][-6:]
        words.append("kwok.log's last warnings and log lines: " + " | ".join(notable))
    return "; ".join(words)


def _logs_object(ns: str, pod: str, path: Path) -> dict:
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs", "metadata": {"name": pod, "namespace": ns},
            "spec": {"logs": [{"containers": ["worker"], "logsFile": str(path)}]}}


@pytest.fixture(scope="module")
def postgres_database_url(databases):
    """A module's own Postgres database, for real-cluster modules that take ``database_url =``
    this: their round's wiring runs on both databases elsewhere, the clusters' time is the cost."""
    with databases.create("postgres") as url:
        databases.made.add(url)
        try:
            yield url
        finally:
            databases.made.discard(url)
