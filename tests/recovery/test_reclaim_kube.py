"""Reclaim on Kubernetes (#30, docs/recovery.md): the control plane's one real node
(stack/kube/node.sh, 2 extended-resource GPUs behind ClusterQueue isthmus-node) runs real
containers. team-a is guaranteed 1 GPU in that pool; team-b's two borrowed 1-GPU jobs take
both. team-a's job then fits nowhere: the gateway stops one of team-b's (the Job suspended,
its pods deleted with the grace period as terminationGracePeriodSeconds): the container gets
SIGTERM, writes a line into its checkpoint directory (a claim on the shared directory) and
exits; its attempt ends ``preempted``, team-a's job is admitted by Kueue, and when the other
borrowed job ends the victim's attempt 2, a new Job, reads what attempt 1 wrote.
"""

from __future__ import annotations

import secrets
import subprocess
import time

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
CLAIM = f"reclaim-{RUN}"
POOL = "kube-node"
MIN_RUNTIME_S, GRACE_S = 5, 5

SCRIPT = ('d="$ISTHMUS_CHECKPOINT_DIR"; n="$ISTHMUS_ATTEMPT"; '
          'if [ -e "$d/log" ]; then echo "attempt $n resumes"; cat "$d/log"; exit 0; fi; '
          'echo "attempt $n starts, grace $ISTHMUS_PREEMPT_GRACE_S s" > "$d/log"; '
          'trap \'echo "attempt $n got TERM" >> "$d/log"; exit 143\' TERM; '
          'while :; do sleep 1; done')


@pytest.fixture(scope="module")
def root():
    if not SHARED.is_dir() or not NODE_ENV.is_file():
        missing_system("the test stack's shared directory or real node is not up (stack/up.sh)")
    base = SHARED / f"rc-{RUN}"
    (base / "ckpt").mkdir(parents=True)
    (base / "ckpt").chmod(0o1777)
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture(scope="module")
def gw(root, k8s, dev_key_path, tmp_path_factory):
    node = read_env_file(NODE_ENV)
    pool = {"name": POOL, "kind": "kubernetes", "gpu_types": [node["ISTHMUS_KUBE_NODE_GPU_TYPE"]],
            "settings": kube_node_settings(kube_env(), node)}
    path = tmp_path_factory.mktemp("reclaim-kube") / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": [pool], "storage": [
        {"name": "ckpt", "path": str(root / "ckpt"), "mode": "read-write", "pools": {POOL: {"pvc": CLAIM}}}]}))
    with claims(k8s, root, {CLAIM: ("ReadWriteMany", str(root / "ckpt"))}), \
            postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, pools_file=str(path), preempt_min_runtime_s=MIN_RUNTIME_S,
                          preempt_grace_s=GRACE_S) as gw:
        gw.admin = gw.headers("root", admin=True)
        r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"guaranteed_gpus_per_pool": {POOL: 1}},
                          headers=gw.admin)
        assert r.status_code == 200, r.text
        assert r.json()["quota"]["guaranteed_gpus_per_pool"] == {POOL: {"value": 1, "source": "team-a"}}
        yield gw


def submit(gw, who: str, name: str) -> dict:
    account = {"alice": "team-a", "bob": "team-b"}[who]
    r = gw.client.post("/v1/jobs", json={
        "name": name, "account": account, "workers": 1, "gpus_per_worker": 1, "memory_per_worker": "128Mi",
        "time_limit": "10m", "checkpoint": {"storage": "ckpt"}, "command": ["sh", "-c", SCRIPT]},
        headers=gw.headers(who, (account,)))
    assert r.status_code == 202, r.text
    return r.json()


def get(gw, job: dict) -> dict:
    return gw.client.get(f"/v1/jobs/{job['id']}", headers=gw.admin).json()


def preempted_by(gw, job: dict) -> list[str]:
    """The preemptors named in the job's preemption events (docs/recovery.md, "Reclaim")."""
    items = gw.client.get(f"/v1/jobs/{job['id']}/events", headers=gw.admin).json()["items"]
    return [e["data"]["preemptor"] for e in items if e["kind"] == "preemption" and "preemptor" in (e.get("data") or {})]


def test_a_guaranteed_job_reclaims_a_borrowed_gpu_from_a_real_container_with_sigterm(gw, k8s):
    b1, b2 = submit(gw, "bob", "b1"), submit(gw, "bob", "b2")
    running = drive_until(gw, lambda: all(job_state(gw, j["id"], "running") for j in (b1, b2)) and
                          [get(gw, j) for j in (b1, b2)], timeout_s=120)
    assert [j["borrowed"] for j in running] == [True, True], running
    time.sleep(MIN_RUNTIME_S + 1)
    a1 = submit(gw, "alice", "a1")
    # Kubernetes stops a victim itself (its pods get the grace period): it may be back in line,
    # on attempt 2, before a look sees its `preemption`; its events say it either way.
    try:
        victim = drive_until(gw, lambda: next((get(gw, j) for j in (b1, b2) if preempted_by(gw, j)), None),
                             timeout_s=30)
    except AssertionError:
        raise AssertionError(f"nothing reclaimed for a1: {get(gw, a1)}") from None
    other = b2 if victim["id"] == b1["id"] else b1
    assert preempted_by(gw, victim) == [a1["id"]] and not preempted_by(gw, other), (victim, other)
    assert get(gw, other)["preemption"] is None
    started = drive_until(gw, lambda: job_state(gw, a1["id"], "running"), timeout_s=120)
    assert started["borrowed"] is False and started["attempt"] == 1, started
    stopped = drive_until(gw, lambda: (j := get(gw, victim)) and j["attempt"] == 2 and j, timeout_s=60)
    (attempt1,) = stopped["attempts"]
    first_run = next(j for j in running if j["id"] == victim["id"])
    assert attempt1["outcome"] == "preempted" and attempt1["backend_job_id"] == first_run["backend_job_id"], attempt1
    said = [e["reason"] for e in gw.client.get(f"/v1/jobs/{victim['id']}/events", headers=gw.admin).json()["items"]]
    assert any("pods deleted: SIGTERM now, SIGKILL after their terminationGracePeriodSeconds (5 s)" in r
               for r in said), said
    # The other borrowed job ends: the victim's attempt 2, a new Job, reads what attempt 1 wrote on SIGTERM.
    gw.client.post(f"/v1/jobs/{other['id']}/cancel", headers=gw.admin)
    done = drive_until(gw, lambda: job_state(gw, victim["id"], *FINAL), timeout_s=120)
    assert done["state"] == "succeeded" and done["backend_job_id"] != first_run["backend_job_id"], done
    out = gw.client.get(f"/v1/jobs/{victim['id']}/logs", params={"worker": 0}, headers=gw.admin).text
    assert out.splitlines() == ["attempt 2 resumes", "attempt 1 starts, grace 5 s", "attempt 1 got TERM"], out
    gw.client.post(f"/v1/jobs/{a1['id']}/cancel", headers=gw.admin)
    drive_until(gw, lambda: all(job_state(gw, j["id"], *FINAL) for j in (a1, other)), timeout_s=90)
    with gw.app.state.sessionmaker() as s:
        assert ledger_reading.verify(s) == []
        assert ledger_rules.charged_gpu_seconds(s, job_id=victim["id"]) > 0
