"""What the Helm tests on the stack's real node share (test_helm_install, _failover, _upgrade).

The fixtures (kube, helm, image, previous_image, slurm) are imported by each test module. A
release lives in a namespace and a database of its own (``release_namespace``); the stack has
no kube-proxy, so a client does what kube-proxy would do for the Service: it takes a ready
endpoint of the Service's EndpointSlice (``Release.endpoints``) on every attempt.

The stack's Postgres and slurmrestd listen on loopback only, so the workers and the migration
run with hostNetwork. API pods in the pod network (``api.hostNetwork: false``, several per
node) reach Postgres through ``Forwarder``, a TCP relay run by the test on the node's side of
its pod network (the pods have no route beyond it); the host-network pods use the same URL.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import os
import random
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from stack.backends_json import kube_node_settings
from tests.conftest import (
    REPO,
    missing_system,
    postgres_database,
    read_env_file,
    wait_for,
)

KSTATE = REPO / ".stack" / "kube"
CERTS = KSTATE / "certs"
API = f"https://127.0.0.1:{os.environ.get('ISTHMUS_KUBE_API_PORT', '16443')}"
SOCK = "/run/isthmus-containerd/containerd.sock"
CTR = ["ctr", "-a", SOCK, "-n", "k8s.io"]
NODE = os.environ.get("ISTHMUS_KUBE_NODE_NAME", "isthmus-node-1")
NODE_IP = os.environ.get("ISTHMUS_KUBE_NODE_IP", "10.246.0.1")
# The node's side of its pod network (stack/kube/node.sh: a CNI bridge, gateway = the subnet's
# first address, no default route in the pods): the one host address a pod can reach.
POD_GATEWAY = str(next(ipaddress.ip_network(os.environ.get("ISTHMUS_KUBE_NODE_POD_SUBNET", "10.245.0.0/24")).hosts()))
TAINT_KEY = "isthmus.io/real-node"  # stack/kube/node.sh
IMAGE = os.environ.get("ISTHMUS_IMAGE", "localhost/isthmus:dev")
CHART = REPO / "deploy/helm/isthmus"
PREVIOUS_RELEASE = REPO / "deploy/helm/PREVIOUS_RELEASE"
FINAL = ("succeeded", "failed", "cancelled")
ON_NODE = {"nodeSelector": {"kubernetes.io/hostname": NODE},
           "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]}
SMALL = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
# One short job per pool, the shapes test_helm_install runs.
SHAPES = {"slurm": {"gpus_per_worker": 8}, "kube-node": {"gpus_per_worker": 1, "memory_per_worker": "256Mi"}}
RETRIABLE = (502, 503, 504)


def run(*argv, timeout=600, check=True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode:
        raise AssertionError(f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind((NODE_IP, 0))
        return s.getsockname()[1]


def kube_client() -> httpx.Client:
    tls = ssl.create_default_context(cafile=str(CERTS / "ca.crt"))
    tls.load_cert_chain(str(CERTS / "admin.crt"), str(CERTS / "admin.key"))  # system:masters
    return httpx.Client(base_url=API, verify=tls, timeout=30)


@pytest.fixture(scope="module")
def kube() -> httpx.Client:
    if not (KSTATE / "kubeconfig").exists() or not Path(SOCK).exists():
        missing_system("the stack's Kubernetes control plane and real node (stack/kube/up.sh, stack/kube/node.sh)")
    client = kube_client()
    try:
        node = client.get(f"/api/v1/nodes/{NODE}").raise_for_status().json()
    except httpx.HTTPError as exc:
        missing_system(f"the stack's real node {NODE} ({exc})")
    if not any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]):
        missing_system(f"node {NODE} is not Ready")
    yield client
    client.close()


@pytest.fixture(scope="module")
def helm() -> Path:
    proc = run("bash", REPO / "stack/kube/helm.sh", timeout=3600, check=False)
    if proc.returncode:
        missing_system(f"stack/kube/helm.sh could not build Helm: {proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def import_image(podman_ref: str, family: str) -> str:
    """``podman_ref`` in the node's containerd as localhost/isthmus:<family>-<podman image id>."""
    image_id = run("podman", "image", "inspect", "--format", "{{.Id}}", podman_ref).stdout.strip()[:12]
    ref = f"localhost/isthmus:{family}-{image_id}"
    refs = run(*CTR, "images", "ls", "-q").stdout.split()
    if ref not in refs:
        # The same family's images of earlier runs: about 430 MB each, never used again.
        stale = [r for r in refs if r.startswith(f"localhost/isthmus:{family}-")]
        if stale:
            run(*CTR, "images", "rm", *stale, check=False)
        run("podman", "tag", podman_ref, ref)
        tar = KSTATE / "node" / f"gateway-{image_id}.tar"
        try:
            run("podman", "save", "-q", "--format", "docker-archive", "-o", tar, ref, timeout=900)
            run(*CTR, "images", "import", "--no-unpack=false", tar, timeout=900)
        finally:
            tar.unlink(missing_ok=True)
            run("podman", "rmi", ref, check=False)
        assert ref in run(*CTR, "images", "ls", "-q").stdout.split(), f"{ref} not in containerd after the import"
    return ref


@pytest.fixture(scope="module")
def image() -> str:
    """This checkout's gateway image (stack/images.sh) in the node's containerd."""
    if shutil.which("podman") is None:
        missing_system("podman (stack/images.sh installs it and builds the gateway image)")
    run("bash", REPO / "stack/images.sh", timeout=3600)
    return import_image(IMAGE, "helm")


def previous_commit() -> str:
    """The previous release (deploy/helm/PREVIOUS_RELEASE: a commit; the project has no tags)."""
    rev = next(ln.split()[0] for ln in PREVIOUS_RELEASE.read_text().splitlines() if ln.strip() and ln[0] != "#")
    proc = run("git", "-C", REPO, "rev-parse", "-q", "--verify", f"{rev}^{{commit}}", check=False)
    if proc.returncode:
        pytest.fail(f"the previous release {rev} (deploy/helm/PREVIOUS_RELEASE) is not in this clone: "
                    "a shallow clone? `git fetch --unshallow` (the upgrade test needs its chart and image)")
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def previous_image() -> str:
    """The previous release's gateway image, built from its own source once per commit."""
    if shutil.which("podman") is None:
        missing_system("podman (stack/images.sh installs it and builds the gateway image)")
    commit = previous_commit()
    run("bash", REPO / "stack/images.sh", "gateway-at", commit, timeout=3600)
    return import_image(f"localhost/isthmus:{commit[:7]}", "release")


def previous_source(commit: str, dest: Path, *paths: str) -> Path:
    """``paths`` of ``commit`` (git archive) under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, *paths], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


@pytest.fixture(scope="module")
def slurm() -> dict:
    path = REPO / ".stack" / "slurm-22.05" / "env"
    if not path.exists():
        missing_system("Slurm 22.05 cluster not running (run stack/slurm/up.sh 22.05)")
    return read_env_file(path)


def ensure_pod_network(kube: httpx.Client, ns: str) -> None:
    """The node's bridge (and so POD_GATEWAY) exists once a pod ran in the pod network: run one
    if none has yet (a fresh stack), so that host-network pods reach POD_GATEWAY too."""
    def bridge_up() -> bool:
        with socket.socket() as s:
            try:
                s.bind((POD_GATEWAY, 0))
                return True
            except OSError:
                return False

    if bridge_up():
        return
    kube.post(f"/api/v1/namespaces/{ns}/pods", json={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-network"},
        "spec": {"restartPolicy": "Never", **ON_NODE, "automountServiceAccountToken": False, "containers": [{
            "name": "true", "image": "localhost/isthmus-debian:bookworm", "imagePullPolicy": "Never",
            "command": ["true"]}]}}).raise_for_status()
    wait_for(bridge_up, 120, f"the node's pod network bridge ({POD_GATEWAY})")
    kube.delete(f"/api/v1/namespaces/{ns}/pods/pod-network")


class Forwarder:
    """A TCP relay from the node's pod-network gateway to a loopback port, for pods in the pod
    network (no route beyond the node's bridge) and on the node's network alike."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.server = socket.create_server((POD_GATEWAY, 0))
        self.port = self.server.getsockname()[1]
        self.open: set[socket.socket] = set()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name="forwarder").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                continue
            try:
                up = socket.create_connection(self.target, timeout=10)
            except OSError:
                conn.close()
                continue
            up.settimeout(None)
            self.open |= {conn, up}
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):  # the other direction's recv() returns: its pump closes dst
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        src.close()
        self.open.discard(src)

    def close(self) -> None:
        self.closed = True
        self.server.close()
        for s in list(self.open):
            with contextlib.suppress(OSError):
                s.close()


@dataclass
class Release:
    """A release "gw" in namespace ``ns``: its values, install/upgrade, endpoints and pods."""

    kube: httpx.Client
    helm: Path
    ns: str
    db_url: str  # for this test (loopback)
    pods_db_url: str  # for the release's pods
    port: int
    token: str
    slurm: dict
    workdir: Path
    revisions: list = field(default_factory=list)

    def values(self, image: str, *, api_replicas=1, worker_replicas=1, api_pod_network=False,
               settings: dict | None = None, worker: dict | None = None) -> dict:
        node_env = read_env_file(KSTATE / "node.env")
        api = {"replicas": api_replicas, "port": self.port, "resources": SMALL, **ON_NODE}
        # In the pod network each API pod has its own address; on the node's, it binds the node's.
        api.update({"hostNetwork": False, "listenAddress": "0.0.0.0"} if api_pod_network else {"listenAddress": NODE_IP})
        mounts = {"dev-issuer": "/etc/isthmus/dev", "slurm-jwt": "/etc/isthmus/slurm", "kube-node": "/etc/isthmus/kube"}
        return {
            "image": {"repository": image.rsplit(":", 1)[0], "tag": image.rsplit(":", 1)[1], "pullPolicy": "Never"},
            "database": {"url": self.pods_db_url},
            "hostNetwork": True,
            "api": api,
            "worker": {"replicas": worker_replicas, "resources": SMALL, **ON_NODE, **(worker or {})},
            "pools": [{"name": "slurm", "kind": "slurm", "settings": {
                "transport": "rest", "rest_url": self.slurm["SLURMRESTD_URL"],
                "jwt_key_path": "/etc/isthmus/slurm/jwt.key", "partition": self.slurm["SLURM_PARTITION"],
                "work_dir": self.slurm["SLURM_WORK_DIR"]}},
                {"name": "kube-node", "kind": "kubernetes", "gpu_types": [node_env["ISTHMUS_KUBE_NODE_GPU_TYPE"]],
                 "settings": {**kube_node_settings({"KUBECONFIG": "/etc/isthmus/kube/kubeconfig"}, node_env)}}],
            "migration": {**ON_NODE, "resources": SMALL},
            "metrics": {"access": "open"},
            "settings": {"DEV_MODE": True, "DEV_KEY_PATH": "/etc/isthmus/dev/dev-issuer.pem", "DEV_ACCOUNTS": "team-a",
                         "LOG_FORMAT": "text", **(settings or {})},
            "extraVolumes": [{"name": n, "secret": {"secretName": n, "defaultMode": 0o440}} for n in mounts],
            "extraVolumeMounts": [{"name": n, "mountPath": p, "readOnly": True} for n, p in mounts.items()],
        }

    def helm_run(self, verb: str, chart: Path, values: dict, timeout_s=300) -> subprocess.CompletedProcess:
        f = self.workdir / f"values-{len(self.revisions)}.yaml"
        f.write_text(yaml.safe_dump(values))
        proc = run(self.helm, verb, "gw", chart, "--kubeconfig", KSTATE / "kubeconfig", "--namespace", self.ns,
                   "-f", f, "--wait", "--timeout", f"{timeout_s}s", timeout=timeout_s + 120, check=False)
        self.revisions.append(proc)
        assert proc.returncode == 0, f"helm {verb}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}\n{self.diag()}"
        return proc

    def pods(self, component: str) -> list[dict]:
        return self.kube.get(f"/api/v1/namespaces/{self.ns}/pods",
                             params={"labelSelector": f"app.kubernetes.io/component={component}"}).json()["items"]

    def endpoints(self, kube: httpx.Client | None = None) -> list[str]:
        """What kube-proxy would send to: the ready endpoints of Service gw-isthmus."""
        slices = (kube or self.kube).get(f"/apis/discovery.k8s.io/v1/namespaces/{self.ns}/endpointslices",
                               params={"labelSelector": "kubernetes.io/service-name=gw-isthmus"}).json()["items"]
        out = []
        for s in slices:
            port = next(p["port"] for p in s.get("ports") or [] if p.get("name") == "http")
            out += [f"http://{e['addresses'][0]}:{port}" for e in s.get("endpoints") or []
                    if (e.get("conditions") or {}).get("ready")]
        return out

    def endpoint(self, timeout_s=60) -> str:
        return wait_for(lambda: (self.endpoints() or [None])[0], timeout_s, "a ready endpoint of Service gw-isthmus",
                        self.diag)

    def diag(self) -> str:
        out = []
        for p in self.kube.get(f"/api/v1/namespaces/{self.ns}/pods").json().get("items", []):
            out.append(f"{p['metadata']['name']}: {p['status'].get('phase')} {p['status'].get('containerStatuses')}")
            for c in p["spec"]["containers"]:
                log = self.kube.get(f"/api/v1/namespaces/{self.ns}/pods/{p['metadata']['name']}/log",
                                    params={"container": c["name"], "tailLines": 30})
                out.append(log.text[-3000:])
        return "\n".join(out)

    def query(self, sql: str, **params) -> list:
        engine = sa.create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                return list(conn.execute(sa.text(sql), params))
        finally:
            engine.dispose()


@contextlib.contextmanager
def release_namespace(kube, helm, slurm, tmp_path: Path, *, forward_db: bool = False):
    """A namespace with the release's Secrets and a fresh database; uninstalled and dropped after."""
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    ns = f"isthmus-helm-{uuid.uuid4().hex[:6]}"
    kube.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": ns}}).raise_for_status()
    key = tmp_path / "dev-issuer.pem"
    issuer = build_dev_issuer(Settings(dev_mode=True, dev_key_path=key, database_url="sqlite://"))
    # The node pool's kubeconfig names its certificates by path: the same, under the mount.
    kubeconfig_doc = yaml.safe_load((KSTATE / "kubeconfig").read_text())
    kubeconfig_doc["clusters"][0]["cluster"]["certificate-authority"] = "/etc/isthmus/kube/ca.crt"
    kubeconfig_doc["users"][0]["user"] = {"client-certificate": "/etc/isthmus/kube/admin.crt",
                                          "client-key": "/etc/isthmus/kube/admin.key"}
    secrets = {"dev-issuer": {"stringData": {"dev-issuer.pem": key.read_text()}},
               "kube-node": {"stringData": {"kubeconfig": yaml.safe_dump(kubeconfig_doc),
                                            **{f: (CERTS / f).read_text() for f in ("ca.crt", "admin.crt", "admin.key")}}},
               "slurm-jwt": {"data": {"jwt.key": base64.b64encode(Path(slurm["SLURM_JWT_KEY"]).read_bytes()).decode()}}}
    forwarder = None
    try:
        for name, body in secrets.items():
            kube.post(f"/api/v1/namespaces/{ns}/secrets", json={
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, **body}).raise_for_status()
        with postgres_database(prefix="isthmus_helm") as db_url:
            if db_url.startswith("postgresql://"):
                db_url = db_url.replace("postgresql://", "postgresql+psycopg://", 1)
            pods_db_url = db_url
            if forward_db:
                ensure_pod_network(kube, ns)
                u = sa.engine.make_url(db_url)
                forwarder = Forwarder(u.port)
                pods_db_url = u.set(host=POD_GATEWAY, port=forwarder.port).render_as_string(hide_password=False)
            rel = Release(kube=kube, helm=helm, ns=ns, db_url=db_url, pods_db_url=pods_db_url, port=free_port(),
                          token=issuer.mint(user="alice", groups=["team-a"], admin=False), slurm=slurm,
                          workdir=tmp_path)
            try:
                yield rel
            finally:
                run(helm, "uninstall", "gw", "--kubeconfig", KSTATE / "kubeconfig", "--namespace", ns, "--wait",
                    "--timeout", "2m", timeout=180, check=False)
                delete_kueue_jobs(rel)
    finally:
        if forwarder:
            forwarder.close()
        kube.delete(f"/api/v1/namespaces/{ns}")
        wait_for(lambda: kube.get(f"/api/v1/namespaces/{ns}").status_code == 404, 120, "the namespace to go")


def delete_kueue_jobs(release: Release) -> None:
    """The release's batch Jobs on the node pool (in the account's namespace, which other tests
    share): the pool keeps finished ones a day."""
    from adapters.kubernetes.render import LABEL_GATEWAY_ID, label_value

    with contextlib.suppress(Exception):  # cleanup only: the database may be gone already
        for (job,) in release.query("select id from job where pool = 'kube-node'"):
            found = release.kube.get("/apis/batch/v1/jobs",
                                     params={"labelSelector": f"{LABEL_GATEWAY_ID}={label_value(job)}"}).json()
            for j in found.get("items", []):
                release.kube.delete(f"/apis/batch/v1/namespaces/{j['metadata']['namespace']}/jobs/"
                                    f"{j['metadata']['name']}", params={"propagationPolicy": "Background"})


def job_body(pool: str, name: str) -> dict:
    return {"name": name, "account": "team-a", "backend": pool, "workers": 1, **SHAPES[pool],
            "time_limit": "5m", "command": ["/bin/sh", "-c", "sleep 1; echo done"]}


class Submitter(threading.Thread):
    """A client submitting a job every ``interval_s`` (pools in turn), each with its own
    Idempotency-Key, to a ready endpoint picked afresh per attempt; it retries the same key on
    connection errors and 502/503/504 (as a client should) and records every answer."""

    def __init__(self, release: Release, pools: list[str], interval_s: float = 1.0, give_up_s: float = 120):
        super().__init__(daemon=True, name="submitter")
        self.release, self.pools, self.interval_s, self.give_up_s = release, pools, interval_s, give_up_s
        self.stop = threading.Event()
        self.accepted: dict[str, str] = {}  # key -> job id
        self.answers: list[tuple[str, str]] = []  # (key, "202" / "200" / "503" / "ConnectError" / ...)
        self.http = httpx.Client(timeout=15, headers={"Authorization": f"Bearer {release.token}"})
        self.kube = kube_client()  # its own: the test's thread uses the other meanwhile

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            pool = self.pools[n % len(self.pools)]
            self.submit(f"load-{uuid.uuid4().hex[:12]}", job_body(pool, f"load-{n}"))
            n += 1
            self.stop.wait(self.interval_s)
        self.http.close()
        self.kube.close()

    def submit(self, key: str, body: dict) -> None:
        deadline = time.monotonic() + self.give_up_s
        while time.monotonic() < deadline:
            try:
                urls = self.release.endpoints(self.kube)
            except httpx.HTTPError as exc:  # the control plane, not the gateway: ask again
                self.answers.append((key, f"endpoints: {type(exc).__name__}"))
                urls = []
            if not urls:
                time.sleep(0.5)
                continue
            try:
                r = self.http.post(f"{random.choice(urls)}/v1/jobs", json=body, headers={"Idempotency-Key": key})
            except httpx.TransportError as exc:  # refused, reset, timed out: the same key again
                self.answers.append((key, type(exc).__name__))
                time.sleep(0.5)
                continue
            self.answers.append((key, str(r.status_code)))
            if r.status_code in (200, 202):
                self.accepted[key] = r.json()["id"]
                return
            if r.status_code not in RETRIABLE:
                self.answers.append((key, f"gave up: {r.text[:300]}"))
                return
            time.sleep(min(float(r.headers.get("Retry-After", 1) or 1), 5))
        self.answers.append((key, "gave up: deadline"))

    def not_retriable(self) -> list[tuple[str, str]]:
        ok = {"200", "202", *map(str, RETRIABLE)}
        return [(k, a) for k, a in self.answers if a not in ok and not a.startswith("endpoints:")
                and not (a.endswith("Error") or a.endswith("Timeout"))]


def check_jobs_once_and_balanced(release: Release, sub: Submitter, timeout_s: float = 150) -> dict:
    """Every accepted key is one job, which ends succeeded, reached its pool once, is charged
    once; no other job exists; ``ledger.verify()`` is empty. Returns {job id: pool}."""
    from adapters.kubernetes.render import LABEL_GATEWAY_ID, label_value
    from adapters.slurm import SlurmBackend, SlurmSettings
    from gateway.ledger import reading

    ids = set(sub.accepted.values())
    assert len(ids) == len(sub.accepted), "two keys answered with one job"

    def ended():
        rows = release.query("select id, state, pool from job")
        return rows if all(r.state in FINAL for r in rows) else None

    rows = wait_for(ended, timeout_s, "every job to end", lambda: str(release.query(
        "select id, state, state_reason from job where state not in ('succeeded', 'failed', 'cancelled')")))
    assert {r.id for r in rows} == ids, "jobs in the database that no client was answered with, or lost ones"
    assert [r for r in rows if r.state != "succeeded"] == []
    assert len(release.query("select id from idempotency_key")) == len(ids)
    kinds = release.query("select job_id, kind, count(*) as n from ledger_entry group by job_id, kind")
    for kind in ("reserve", "start", "usage"):
        assert {r.job_id: r.n for r in kinds if r.kind == kind} == dict.fromkeys(ids, 1), kind

    env = release.slurm
    slurm = SlurmBackend(SlurmSettings(transport="rest", rest_url=env["SLURMRESTD_URL"],
                                       jwt_key_path=env["SLURM_JWT_KEY"], partition=env["SLURM_PARTITION"],
                                       work_dir=env["SLURM_WORK_DIR"]))
    try:
        on_slurm = [s.gateway_job_id for s in slurm.list_gateway_jobs()]
    finally:
        slurm.close()
    pools = {r.id: r.pool for r in rows}
    for job, pool in pools.items():
        if pool == "slurm":
            assert on_slurm.count(job) == 1, (job, on_slurm.count(job))
        else:
            found = release.kube.get("/apis/batch/v1/jobs",
                                     params={"labelSelector": f"{LABEL_GATEWAY_ID}={label_value(job)}"}).json()
            assert len(found["items"]) == 1, (job, [j["metadata"]["name"] for j in found["items"]])

    engine = sa.create_engine(release.db_url)
    try:
        with Session(engine) as s:
            assert reading.verify(s) == []
    finally:
        engine.dispose()
    return pools
