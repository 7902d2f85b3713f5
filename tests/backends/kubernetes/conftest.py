"""Fixtures for the kubernetes backend tests against the local control plane (stack/kube)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from adapters.base import SubmitRequest
from adapters.kubernetes import KubernetesBackend, KubernetesSettings
from adapters.kubernetes.render import TOMBSTONE_FINALIZER
from adapters.kubernetes.settings import read_env_file

REPO = Path(__file__).resolve().parents[3]
ENV_FILE = REPO / ".stack" / "kube" / "env"
FAKE_RUN_FOR = "isthmus.io/fake-run-for"  # kwok stage labels (stack/kube/kwok-stages.yaml)
FAKE_EXIT_CODE = "isthmus.io/fake-exit-code"
SEED_LABEL = "isthmus.io/seed-test"
SUITE_LABEL = "isthmus.io/test-suite"  # on every Job/pod these tests create, and only those
SUITE = "backends-kubernetes"


@pytest.fixture(scope="session")
def kube_env() -> dict[str, str]:
    if not ENV_FILE.exists():
        msg = f"{ENV_FILE} missing: start the control plane with stack/kube/up.sh"
        if os.environ.get("ISTHMUS_REQUIRE_STACK") == "1":
            pytest.fail(msg + " (ISTHMUS_REQUIRE_STACK=1)")
        pytest.skip(msg)
    return read_env_file(ENV_FILE)


@pytest.fixture(scope="session")
def settings(kube_env) -> KubernetesSettings:
    return KubernetesSettings.from_env(env={}, env_file=ENV_FILE, request_timeout_s=15.0)


@pytest.fixture(scope="session")
def accounts(kube_env) -> list[str]:
    return kube_env["ISTHMUS_KUBE_ACCOUNTS"].split(",")


@pytest.fixture(scope="session")
def backend(settings):
    b = KubernetesBackend(settings)
    yield b
    b.close()


@pytest.fixture(scope="session")
def h100(settings, kube_env):
    """The second pool on the one control plane: ClusterQueue ``isthmus-h100`` over the h100 nodes."""
    if "ISTHMUS_KUBE_H100_CLUSTER_QUEUE" not in kube_env:
        pytest.skip("the stack's control plane has no second pool (re-run stack/kube/up.sh)")
    import dataclasses

    b = KubernetesBackend(dataclasses.replace(settings, cluster_queue=kube_env["ISTHMUS_KUBE_H100_CLUSTER_QUEUE"],
                                              local_queue=kube_env["ISTHMUS_KUBE_H100_LOCAL_QUEUE"]))
    yield b
    b.close()


class Kube:
    """Direct kubernetes-client access for assertions the adapter does not expose."""

    def __init__(self, settings: KubernetesSettings, namespaces: list[str]):
        from kubernetes import client, config

        self.api_client = config.new_client_from_config(config_file=settings.kubeconfig)
        self.core = client.CoreV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.namespaces = namespaces
        self.settings = settings

    def pods_of(self, backend_job_id: str) -> list:
        ns, name = backend_job_id.split("/")
        return self.core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={name}").items

    def cluster_queue(self) -> dict:
        return self.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues",
                                                     self.settings.cluster_queue)

    def reserved_gpus(self) -> int:
        st = self.cluster_queue().get("status") or {}
        return sum(int(r.get("total", "0")) for f in st.get("flavorsReservation") or []
                   for r in f["resources"] if r["name"] == "nvidia.com/gpu")

    def _drop_tombstone(self, name: str, ns: str) -> None:
        """Remove our finalizer. The garbage collector edits the same list (foregroundDeletion),
        so the patch is guarded by resourceVersion and retried on a fresh read."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(5):
            try:
                job = self.batch.read_namespaced_job(name, ns)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            finalizers = job.metadata.finalizers or []
            if TOMBSTONE_FINALIZER not in finalizers:
                return
            try:
                self.batch.patch_namespaced_job(name, ns, [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": job.metadata.resource_version},
                    {"op": "replace", "path": "/metadata/finalizers",
                     "value": [f for f in finalizers if f != TOMBSTONE_FINALIZER]}])
                return
            except ApiException as exc:
                if exc.status not in (404, 409, 422):
                    raise
                if exc.status == 404:
                    return

    def clean(self, timeout_s: float = 90) -> None:
        """Remove this suite's Jobs and pods (tombstones included) and wait until they are
        gone and the ClusterQueue holds no reservation. Other suites' Jobs are left alone;
        if they hold quota, this waits for them (the tests assert on the whole pool)."""
        mine = (f"{SUITE_LABEL}={SUITE}", SEED_LABEL)
        for ns in self.namespaces:
            for sel in mine:
                for job in self.batch.list_namespaced_job(ns, label_selector=sel).items:
                    self._drop_tombstone(job.metadata.name, ns)
                    try:
                        self.batch.delete_namespaced_job(job.metadata.name, ns, propagation_policy="Background")
                    except Exception:  # noqa: BLE001, S110 - already gone, or the settle below reports it
                        pass
                for pod in self.core.list_namespaced_pod(ns, label_selector=sel).items:
                    try:
                        self.core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
                    except Exception:  # noqa: BLE001, S110 - already gone, or the settle below reports it
                        pass

        def leftovers() -> list[str]:
            return [f"{ns}/{o.metadata.name}" for ns in self.namespaces for sel in mine
                    for o in self.core.list_namespaced_pod(ns, label_selector=sel).items
                    + self.batch.list_namespaced_job(ns, label_selector=sel).items]

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not leftovers() and self.reserved_gpus() == 0:
                return
            time.sleep(0.5)
        raise AssertionError(f"cluster did not become clean: left {leftovers()}, "
                             f"{self.reserved_gpus()} GPUs reserved (by this suite or another one)")


@pytest.fixture(scope="session")
def kube(settings, kube_env):
    k = Kube(settings, kube_env["ISTHMUS_KUBE_NAMESPACES"].split(","))
    yield k
    k.api_client.close()


@pytest.fixture
def clean(kube):
    kube.clean()
    yield kube
    kube.clean()


def request(gid: str, *, account: str = "team-a", workers: int = 1, gpus: int = 8, labels=None,
            priority: int = 0, cpus: int = 4, memory_mib: int = 8192,
            priority_class: str | None = None) -> SubmitRequest:
    return SubmitRequest(
        gateway_job_id=gid, name=f"test {gid}", account=account, user="alice",
        command=["python", "-m", "train", "--epochs", "1"], workers=workers, gpus_per_worker=gpus,
        cpus_per_worker=cpus, memory_mib_per_worker=memory_mib, time_limit_s=3600,
        env={"EXPERIMENT": "contract"}, labels={SUITE_LABEL: SUITE, **(labels or {})}, priority=priority,
        priority_class=priority_class,
    )


@pytest.fixture
def scenario(accounts):
    def make(kind: str, gid: str) -> SubmitRequest:
        if kind == "succeeds":
            return request(gid, account=accounts[0], workers=2, gpus=1, labels={FAKE_RUN_FOR: "2s"})
        if kind == "fails":
            return request(gid, account=accounts[0], workers=2, gpus=1,
                           labels={FAKE_RUN_FOR: "2s", FAKE_EXIT_CODE: "3"})
        if kind == "long":
            return request(gid, account=accounts[0], workers=1, gpus=1)
        if kind == "too_big":
            return request(gid, account=accounts[0], workers=1, gpus=16)  # nodes have 8
        raise ValueError(kind)

    return make
