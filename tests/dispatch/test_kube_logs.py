"""A Kueue job's output, per worker, through the API and the CLI (real control plane + kwok).

kwok runs no containers: the stand-in for a worker's container output is a file this test
writes under ``$ISTHMUS_KUBE_STATE_DIR/container-output`` (CRI log format) and names in a
kwok ``Logs`` object for the worker's pod; kwok's kubelet server then serves it to the
apiserver's ``pods/log`` (stack/kube/kwok.sh, docs/logs.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dispatch.conftest import (
    KWOK_RUN_FOR,
    drive_until,
    fake_container_output,
    job_state,
    kube_backend_options,
    wired_gateway,
    worker_pods,
)
from tests.jobs.live import served

pytestmark = pytest.mark.kubernetes
FINAL = ("succeeded", "failed", "cancelled")
ISTHMUS = str(Path(sys.executable).with_name("isthmus"))


@pytest.fixture
def gw(database_url, dev_key_path, kube, tmp_path):
    # One database is enough (tests/conftest.py: cluster tests run on Postgres).
    with wired_gateway(database_url, dev_key_path, {"kubernetes": kube_backend_options(kube)},
                       output_keep_dir=str(tmp_path / "kept"), output_keep_mib=1) as gw:
        yield gw


def submit(gw, **spec) -> str:
    body = {"name": "kube-logs", "account": "team-a", "backend": "kubernetes", "workers": 2, "gpus_per_worker": 1,
            "command": ["python", "train.py"], "image": "registry.example/trainer:1", "time_limit": "10m", **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def lines(worker: int) -> list[str]:
    return [f"w{worker} start", f"w{worker} step 1", f"w{worker} done"]


def pods_gone(k8s, backend_job_id: str) -> bool:
    ns, name = backend_job_id.split("/")
    return not worker_pods(k8s[0], ns, name)


def test_kueue_job_output_per_worker_live_and_after_its_pods_are_gone(gw, kube, k8s):
    h = gw.headers("alice", ("team-a",))
    job = submit(gw, labels={KWOK_RUN_FOR: "12s"})
    running = drive_until(gw, lambda: job_state(gw, job, "running", *FINAL), timeout_s=90)
    assert running["state"] == "running", running
    fake_container_output(kube, k8s, running["backend_job_id"], 2, lines)

    # While it runs: the pod log API, per worker, and its tail.
    for worker in (0, 1):
        r = gw.client.get(f"/v1/jobs/{job}/logs", params={"worker": worker}, headers=h)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
        assert r.text.splitlines() == lines(worker)
    tail = gw.client.get(f"/v1/jobs/{job}/logs", params={"worker": 1, "tail": 1}, headers=h)
    assert tail.text == "w1 done\n"
    assert gw.client.get(f"/v1/jobs/{job}/logs", headers=gw.headers("mallory", ("team-b",))).status_code == 404

    # It ends; the gateway keeps the output; then the Job and its pods go.
    final = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=90)
    assert final["state"] == "succeeded", final
    kept = Path(gw.settings.output_keep_dir) / job
    drive_until(gw, lambda: len(list(kept.glob("worker-*.out"))) == 2, timeout_s=30)
    ns, name = final["backend_job_id"].split("/")
    k8s[2].delete_namespaced_job(name, ns, propagation_policy="Background")
    drive_until(gw, lambda: pods_gone(k8s, final["backend_job_id"]), timeout_s=60)

    for worker in (0, 1):
        r = gw.client.get(f"/v1/jobs/{job}/logs", params={"worker": worker}, headers=h)
        assert r.status_code == 200 and r.text.splitlines() == lines(worker), r.text
    assert gw.client.get(f"/v1/jobs/{job}/logs", params={"worker": 0, "tail": 2},
                         headers=h).text == "w0 step 1\nw0 done\n"
    with served(gw.app) as url:
        env = {**os.environ, "ISTHMUS_URL": url, "ISTHMUS_TOKEN": gw.token("alice", ("team-a",))}
        cli = subprocess.run([ISTHMUS, "logs", job, "--worker", "1"], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert cli.returncode == 0 and cli.stdout.splitlines() == lines(1), cli.stderr
        env_other = {**env, "ISTHMUS_TOKEN": gw.token("mallory", ("team-b",))}
        denied = subprocess.run([ISTHMUS, "logs", job], env=env_other, capture_output=True, text=True,
                                timeout=60, check=False)
        assert denied.returncode == 1 and "404" in denied.stderr
    assert gw.client.get(f"/v1/jobs/{job}/logs", headers=gw.headers("mallory", ("team-b",))).status_code == 404


def test_a_cancelled_kueue_job_keeps_its_output(gw, kube, k8s):
    """Cancelling deletes the pods at once: the gateway keeps their output first."""
    h = gw.headers("alice", ("team-a",))
    job = submit(gw, workers=1)  # no run-for label: runs until cancelled
    running = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=90)
    fake_container_output(kube, k8s, running["backend_job_id"], 1, lines)
    assert gw.client.post(f"/v1/jobs/{job}/cancel", headers=h).json()["state"] == "cancelling"
    drive_until(gw, lambda: job_state(gw, job, "cancelled"), timeout_s=60)
    drive_until(gw, lambda: pods_gone(k8s, running["backend_job_id"]), timeout_s=60)
    r = gw.client.get(f"/v1/jobs/{job}/logs", headers=h)
    assert r.status_code == 200 and r.text.splitlines() == lines(0), r.text
