"""The Helm chart installed for real on the stack's control plane and its real node (issue #47, item 4).

The gateway image (stack/images.sh, podman) is imported into the node's containerd the way
stack/kube/node.sh imports the worker image, keyed by podman's image id. The chart is
installed with Helm v4 (stack/kube/helm.sh) into a namespace of its own, against a fresh
database on the stack's Postgres, with one API pod, one dispatch worker and two pools: the
stack's Slurm 22.05 and Kueue on the real node (its kubeconfig and certificates from a Secret).
That Postgres and slurmrestd listen on loopback only, so the release
runs with hostNetwork and the API binds the node's private address (10.246.0.1, on the
loopback device: reachable from this machine only). The stack has no kube-proxy, so the test
does what kube-proxy would do for the Service: it takes a ready endpoint from the Service's
EndpointSlice, which holds the API pods only once their /readyz passes, and submits there.
A job per pool must run there to the end, once, charged once.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import yaml

from stack.backends_json import kube_node_settings
from tests.conftest import (
    REPO,
    missing_system,
    postgres_database,
    read_env_file,
    wait_for,
)

pytestmark = [pytest.mark.kubernetes, pytest.mark.slurm, pytest.mark.uses("podman")]
KSTATE = REPO / ".stack" / "kube"
CERTS = KSTATE / "certs"
API = f"https://127.0.0.1:{os.environ.get('ISTHMUS_KUBE_API_PORT', '16443')}"
SOCK = "/run/isthmus-containerd/containerd.sock"
NODE = os.environ.get("ISTHMUS_KUBE_NODE_NAME", "isthmus-node-1")
NODE_IP = os.environ.get("ISTHMUS_KUBE_NODE_IP", "10.246.0.1")
TAINT_KEY = "isthmus.io/real-node"  # stack/kube/node.sh
IMAGE = os.environ.get("ISTHMUS_IMAGE", "localhost/isthmus:dev")
CONTAINER_UID = 10001
FINAL = ("succeeded", "failed", "cancelled")


def run(*argv, timeout=600, check=True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode:
        raise AssertionError(f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((NODE_IP, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def kube() -> httpx.Client:
    if not (KSTATE / "kubeconfig").exists() or not Path(SOCK).exists():
        missing_system("the stack's Kubernetes control plane and real node (stack/kube/up.sh, stack/kube/node.sh)")
    import ssl

    tls = ssl.create_default_context(cafile=str(CERTS / "ca.crt"))
    tls.load_cert_chain(str(CERTS / "admin.crt"), str(CERTS / "admin.key"))  # system:masters
    client = httpx.Client(base_url=API, verify=tls, timeout=30)
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


@pytest.fixture(scope="module")
def image() -> str:
    """The gateway image in the node's containerd, tagged with podman's image id."""
    if shutil.which("podman") is None:
        missing_system("podman (stack/images.sh installs it and builds the gateway image)")
    run("bash", REPO / "stack/images.sh", timeout=3600)
    image_id = run("podman", "image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()[:12]
    ref = f"localhost/isthmus:helm-{image_id}"
    ctr = ["ctr", "-a", SOCK, "-n", "k8s.io"]
    refs = run(*ctr, "images", "ls", "-q").stdout.split()
    if ref not in refs:
        # Older gateway images imported by earlier runs: about 430 MB each, never used again.
        stale = [r for r in refs if r.startswith("localhost/isthmus:helm-")]
        if stale:
            run(*ctr, "images", "rm", *stale, check=False)
        run("podman", "tag", IMAGE, ref)
        tar = KSTATE / "node" / f"gateway-{image_id}.tar"
        try:
            run("podman", "save", "-q", "--format", "docker-archive", "-o", tar, ref, timeout=900)
            run(*ctr, "images", "import", "--no-unpack=false", tar, timeout=900)
        finally:
            tar.unlink(missing_ok=True)
            run("podman", "rmi", ref, check=False)
        assert ref in run(*ctr, "images", "ls", "-q").stdout.split(), f"{ref} not in containerd after the import"
    return ref


@pytest.fixture(scope="module")
def slurm() -> dict:
    path = REPO / ".stack" / "slurm-22.05" / "env"
    if not path.exists():
        missing_system("Slurm 22.05 cluster not running (run stack/slurm/up.sh 22.05)")
    return read_env_file(path)


@pytest.fixture
def release(kube, helm, image, slurm, tmp_path):
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    ns = f"isthmus-helm-{uuid.uuid4().hex[:6]}"
    kube.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": ns}}).raise_for_status()
    key = tmp_path / "dev-issuer.pem"
    issuer = build_dev_issuer(Settings(dev_mode=True, dev_key_path=key, database_url="sqlite://"))
    kube.post(f"/api/v1/namespaces/{ns}/secrets", json={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "dev-issuer"},
        "stringData": {"dev-issuer.pem": key.read_text()}}).raise_for_status()
    # The node pool's kubeconfig names its certificates by path: the same, under the mount.
    kubeconfig_doc = yaml.safe_load((KSTATE / "kubeconfig").read_text())
    kubeconfig_doc["clusters"][0]["cluster"]["certificate-authority"] = "/etc/isthmus/kube/ca.crt"
    kubeconfig_doc["users"][0]["user"] = {"client-certificate": "/etc/isthmus/kube/admin.crt",
                                          "client-key": "/etc/isthmus/kube/admin.key"}
    kube.post(f"/api/v1/namespaces/{ns}/secrets", json={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kube-node"},
        "stringData": {"kubeconfig": yaml.safe_dump(kubeconfig_doc),
                       **{f: (CERTS / f).read_text() for f in ("ca.crt", "admin.crt", "admin.key")}}}).raise_for_status()
    kube.post(f"/api/v1/namespaces/{ns}/secrets", json={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "slurm-jwt"},
        "data": {"jwt.key": base64.b64encode(Path(slurm["SLURM_JWT_KEY"]).read_bytes()).decode()}}).raise_for_status()
    port = free_port()
    node_env = read_env_file(KSTATE / "node.env")
    kubeconfig = KSTATE / "kubeconfig"
    with postgres_database(prefix="isthmus_helm") as db_url:
        on_node = {"nodeSelector": {"kubernetes.io/hostname": NODE},
                   "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]}
        small = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
        values = {
            "image": {"repository": image.rsplit(":", 1)[0], "tag": image.rsplit(":", 1)[1], "pullPolicy": "Never"},
            "database": {"url": db_url.replace("postgresql://", "postgresql+psycopg://", 1)
                         if db_url.startswith("postgresql://") else db_url},
            "hostNetwork": True,
            "api": {"replicas": 1, "port": port, "listenAddress": NODE_IP, "resources": small,
                    **on_node},
            "worker": {"replicas": 1, "resources": small, **on_node},
            "pools": [{"name": "slurm", "kind": "slurm", "settings": {
                "transport": "rest", "rest_url": slurm["SLURMRESTD_URL"], "jwt_key_path": "/etc/isthmus/slurm/jwt.key",
                "partition": slurm["SLURM_PARTITION"], "work_dir": slurm["SLURM_WORK_DIR"]}},
                {"name": "kube-node", "kind": "kubernetes", "gpu_types": [node_env["ISTHMUS_KUBE_NODE_GPU_TYPE"]],
                 "settings": {**kube_node_settings({"KUBECONFIG": "/etc/isthmus/kube/kubeconfig"}, node_env)}}],
            "migration": {**on_node, "resources": small},
            "metrics": {"access": "open"},
            "settings": {"DEV_MODE": True, "DEV_KEY_PATH": "/etc/isthmus/dev/dev-issuer.pem", "DEV_ACCOUNTS": "team-a",
                         "LOG_FORMAT": "text"},
            "extraVolumes": [{"name": "dev-issuer", "secret": {"secretName": "dev-issuer", "defaultMode": 0o440}},
                             {"name": "slurm-jwt", "secret": {"secretName": "slurm-jwt", "defaultMode": 0o440}},
                             {"name": "kube-node", "secret": {"secretName": "kube-node", "defaultMode": 0o440}}],
            "extraVolumeMounts": [{"name": "dev-issuer", "mountPath": "/etc/isthmus/dev", "readOnly": True},
                                  {"name": "slurm-jwt", "mountPath": "/etc/isthmus/slurm", "readOnly": True},
                                  {"name": "kube-node", "mountPath": "/etc/isthmus/kube", "readOnly": True}],
        }
        f = tmp_path / "values.yaml"
        f.write_text(yaml.safe_dump(values))
        info = {"ns": ns, "db_url": values["database"]["url"], "port": port,
                "token": issuer.mint(user="alice", groups=["team-a"], admin=False)}
        try:
            proc = run(helm, "install", "gw", REPO / "deploy/helm/isthmus", "--kubeconfig", kubeconfig,
                       "--namespace", ns, "-f", f, "--wait", "--timeout", "5m", timeout=420, check=False)
            info["install"] = proc
            yield info
        finally:
            run(helm, "uninstall", "gw", "--kubeconfig", kubeconfig, "--namespace", ns, "--wait", "--timeout", "2m",
                timeout=180, check=False)
            kube.delete(f"/api/v1/namespaces/{ns}")
            wait_for(lambda: kube.get(f"/api/v1/namespaces/{ns}").status_code == 404, 120, "the namespace to go")


def _pods(kube, ns) -> str:
    items = kube.get(f"/api/v1/namespaces/{ns}/pods").json().get("items", [])
    out = []
    for p in items:
        out.append(f"{p['metadata']['name']}: {p['status'].get('phase')} {p['status'].get('containerStatuses')}")
        for c in p["spec"]["containers"]:
            log = kube.get(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}/log",
                           params={"container": c["name"], "tailLines": 30})
            out.append(log.text[-3000:])
    return "\n".join(out)


def test_chart_installs_and_runs_jobs_on_slurm_and_kueue_submitted_through_the_service(kube, release):
    ns = release["ns"]
    assert release["install"].returncode == 0, release["install"].stderr + _pods(kube, ns)
    # The migration hook ran before the API started: the schema is at head.
    engine = sa.create_engine(release["db_url"])
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("select version_num from alembic_version")).scalar()
    finally:
        engine.dispose()
    # ... and was deleted on success (hook-succeeded), with its Secret.
    assert kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/gw-isthmus-migrate").status_code == 404
    assert kube.get(f"/api/v1/namespaces/{ns}/secrets/gw-isthmus-migrate").status_code == 404

    # The pod runs as the image's non-root user with a read-only root filesystem.
    (pod,) = kube.get(f"/api/v1/namespaces/{ns}/pods",
                      params={"labelSelector": "app.kubernetes.io/component=api"}).json()["items"]
    assert pod["spec"]["securityContext"]["runAsUser"] == CONTAINER_UID
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True

    # What kube-proxy would do for Service gw-isthmus: a ready endpoint of its EndpointSlice.
    def endpoint():
        slices = kube.get(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                          params={"labelSelector": "kubernetes.io/service-name=gw-isthmus"}).json()["items"]
        for s in slices:
            port = next(p["port"] for p in s.get("ports") or [] if p.get("name") == "http")
            for e in s.get("endpoints") or []:
                if (e.get("conditions") or {}).get("ready"):
                    return f"http://{e['addresses'][0]}:{port}"
        return None

    url = wait_for(endpoint, 60, "a ready endpoint of Service gw-isthmus", lambda: _pods(kube, ns))
    assert url == f"http://{NODE_IP}:{release['port']}"
    ready = httpx.get(f"{url}/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["database"] == "ok", ready.text

    headers = {"Authorization": f"Bearer {release['token']}"}
    jobs = {}
    for pool, shape in (("slurm", {"gpus_per_worker": 8}), ("kube-node", {"gpus_per_worker": 1, "memory_per_worker": "256Mi"})):
        body = {"name": f"helm-{pool}", "account": "team-a", "backend": pool, "workers": 1, **shape,
                "time_limit": "5m", "command": ["/bin/sh", "-c", "sleep 2; echo done"]}
        r = httpx.post(f"{url}/v1/jobs", json=body, headers=headers, timeout=30)
        assert r.status_code == 202, r.text
        jobs[pool] = r.json()["id"]

    # The release's dispatch worker sends each to its pool (the stack's Slurm 22.05; Kueue
    # on the real node, where it runs in containerd), where it runs to the end.
    def final(job):
        j = httpx.get(f"{url}/v1/jobs/{job}", headers=headers, timeout=10).json()
        return j if j["state"] in FINAL else None

    engine = sa.create_engine(release["db_url"])
    try:
        for pool, job in jobs.items():
            done = wait_for(lambda job=job: final(job), 180, f"the job on {pool} to end", lambda: _pods(kube, ns))
            assert done["state"] == "succeeded" and done["exit_code"] == 0 and done["backend_job_id"], (pool, done)
            with engine.connect() as conn:
                kinds = [k for (k,) in conn.execute(sa.text("select kind from ledger_entry where job_id = :j"),
                                                     {"j": job})]
            assert kinds.count("reserve") == 1 and kinds.count("start") == 1 and kinds.count("usage") == 1, \
                (pool, kinds)
        with engine.connect() as conn:
            assert conn.execute(sa.text("select count(*) from job")).scalar() == 2
    finally:
        engine.dispose()
