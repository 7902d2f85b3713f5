"""Retries on Kubernetes (#30, docs/recovery.md): the control plane's one real node
(stack/kube/node.sh) runs a real container; its pod is evicted through the eviction API, as
`kubectl drain` does. The pod carries the DisruptionTarget condition, the Job fails, and the
gateway runs attempt 2, a new Job, whose container finds in the checkpoint directory (a claim
on the shared directory, mounted by the real kubelet) the file attempt 1 wrote.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

from adapters.envfile import read_env_file
from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from stack.backends_json import kube_node_settings
from tests.conftest import REPO, missing_system, postgres_database
from tests.dispatch.conftest import drive_until, job_state, kube_env, wired_gateway
from tests.pools.test_five_pools import FINAL
from tests.storage.test_storage import NODE_ENV, claims, k8s  # noqa: F401  (k8s: a fixture)

pytestmark = [pytest.mark.kubernetes, pytest.mark.postgres]

SHARED = REPO / ".stack" / "shared"
RUN = secrets.token_hex(4)
CLAIM = f"rckpt-{RUN}"


@pytest.fixture(scope="module")
def root():
    if not SHARED.is_dir() or not NODE_ENV.is_file():
        missing_system("the test stack's shared directory or real node is not up (stack/up.sh)")
    base = SHARED / f"rk-{RUN}"
    (base / "ckpt").mkdir(parents=True)
    (base / "ckpt").chmod(0o1777)
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture(scope="module")
def gw(root, k8s, dev_key_path, tmp_path_factory):
    node = read_env_file(NODE_ENV)
    pool = {"name": "kube-node", "kind": "kubernetes", "gpu_types": [node["ISTHMUS_KUBE_NODE_GPU_TYPE"]],
            "settings": kube_node_settings(kube_env(), node)}
    path = tmp_path_factory.mktemp("recovery-kube") / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": [pool], "storage": [
        {"name": "ckpt", "path": str(root / "ckpt"), "mode": "read-write", "pools": {"kube-node": {"pvc": CLAIM}}}]}))
    with claims(k8s, root, {CLAIM: ("ReadWriteMany", str(root / "ckpt"))}), \
            postgres_database(migrated=True) as url, wired_gateway(url, dev_key_path, {}, pools_file=str(path)) as gw:
        gw.admin = gw.headers("root", admin=True)
        yield gw


def test_an_evicted_worker_runs_again_as_a_new_job_in_the_same_checkpoint_dir(gw, k8s):
    _, core, _ = k8s
    r = gw.client.post("/v1/jobs", json={
        "name": "evicted", "account": "team-a", "workers": 1, "gpus_per_worker": 1, "memory_per_worker": "256Mi",
        "time_limit": "5m", "checkpoint": {"storage": "ckpt"}, "command": ["sh", "-c",
            ('echo "attempt $ISTHMUS_ATTEMPT was here" >> "$ISTHMUS_CHECKPOINT_DIR/log"; '
            'if [ "$ISTHMUS_ATTEMPT" = 1 ]; then trap "exit 143" TERM; sleep 300 & wait; fi; '
            'cat "$ISTHMUS_CHECKPOINT_DIR/log"')]}, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    job = r.json()
    log = Path(job["checkpoint_dir"]) / "log"
    running = drive_until(gw, lambda: log.is_file() and job_state(gw, job["id"], "running"), timeout_s=90)
    ns, name = running["backend_job_id"].split("/", 1)
    (pod,) = core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
    core.create_namespaced_pod_eviction(pod.metadata.name, ns, {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod.metadata.name, "namespace": ns}})
    done = drive_until(gw, lambda: job_state(gw, job["id"], *FINAL), timeout_s=120)
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    (first,) = done["attempts"]
    assert first["outcome"] == "node_failure" and first["backend_job_id"] == running["backend_job_id"], first
    assert done["backend_job_id"] != running["backend_job_id"] and "-a2-" in done["backend_job_id"], done
    out = gw.client.get(f"/v1/jobs/{job['id']}/logs", params={"worker": 0}, headers=gw.admin).text
    assert out.splitlines() == ["attempt 1 was here", "attempt 2 was here"], out
    with gw.app.state.sessionmaker() as s:
        assert ledger_reading.verify(s) == []
        assert ledger_rules.charged_gpu_seconds(s, job_id=job["id"]) > 0
