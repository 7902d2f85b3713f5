"""Structured logs from a real `isthmus serve`: JSON lines with request and job ids, and no
secrets (docs/operations.md)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx

from tests.conftest import REPO
from tests.e2e.conftest import ISTHMUS, free_port, start_gateway

JOB = {"name": "logs", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1,
       "memory_per_worker": "1Gi", "time_limit": "10m"}


def test_json_lines_carry_request_and_job_ids_and_never_the_token(tmp_path, dev_key_path):
    port = free_port()
    env = {**os.environ, "ISTHMUS_DATABASE_URL": f"sqlite:///{tmp_path / 'gw.db'}", "ISTHMUS_DEV_MODE": "true",
           "ISTHMUS_DEV_KEY_PATH": str(dev_key_path), "ISTHMUS_DEV_ACCOUNTS": "team-a", "ISTHMUS_LOG_FORMAT": "json"}
    log = tmp_path / "gateway.log"
    proc = start_gateway(env, port, log)
    try:
        token = subprocess.run([ISTHMUS, "token", "--user", "alice", "--groups", "team-a"], env=env, cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        base = f"http://127.0.0.1:{port}"
        h = {"Authorization": f"Bearer {token}"}
        r = httpx.post(f"{base}/v1/jobs", json=JOB, headers={**h, "X-Request-ID": "req-abc.123"}, timeout=10)
        assert r.status_code == 202 and r.headers["x-request-id"] == "req-abc.123"
        job_id = r.json()["id"]
        r = httpx.post(f"{base}/v1/jobs/{job_id}/cancel", headers={**h, "X-Request-ID": "bad id\twith space"},
                       timeout=10)
        assert r.status_code in (200, 202)
        minted = r.headers["x-request-id"]
        assert minted != "bad id\twith space" and len(minted) == 32  # replaced, never echoed raw
    finally:
        proc.terminate()
        proc.wait(15)
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "msg"} <= set(rec) for rec in records)
    access = [rec for rec in records if rec["logger"] == "isthmus.access"]
    submit = next(rec for rec in access if rec.get("request_id") == "req-abc.123")
    assert (submit["method"], submit["path"], submit["status"]) == ("POST", "/v1/jobs", 202)
    assert isinstance(submit["duration_ms"], float)
    cancel = [rec for rec in records if rec.get("job_id") == job_id and "cancelled" in rec["msg"]]
    assert cancel and cancel[0]["request_id"] == minted and cancel[0]["account"] == "team-a"
    assert token not in log.read_text() and token.split(".")[2] not in log.read_text()


def test_a_warning_that_repeats_is_logged_once_per_window_with_the_count(tmp_path, dev_key_path):
    """Issue #45: with its Kubernetes API server unreachable the gateway logged about three
    retries a second, without bound. A real `isthmus serve` whose pool's API server is gone
    (a closed port): each repeated warning at most once per window, the next with the count."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: gone, cluster: {{server: 'https://127.0.0.1:{free_port()}'}}}}]\n"
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: c, context: {cluster: gone, user: u}}]\ncurrent-context: c\n")
    port = free_port()
    env = {**os.environ, "ISTHMUS_DATABASE_URL": f"sqlite:///{tmp_path / 'gw.db'}", "ISTHMUS_DEV_MODE": "true",
           "ISTHMUS_DEV_KEY_PATH": str(dev_key_path), "ISTHMUS_DEV_ACCOUNTS": "team-a", "ISTHMUS_LOG_FORMAT": "json",
           "ISTHMUS_LOG_REPEAT_WINDOW_S": "4",
           "ISTHMUS_BACKENDS": json.dumps({"kube": {"kind": "kubernetes", "kubeconfig": str(kubeconfig),
                                                    "cluster_queue": "q", "local_queue": "q"}})}
    log = tmp_path / "gateway.log"
    proc = start_gateway(env, port, log)
    try:
        time.sleep(13)
    finally:
        proc.terminate()
        proc.wait(15)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    retries = [line for line in lines if line["logger"] == "urllib3.connectionpool" and line["level"] == "warning"]
    # About 25 in 13 s before; now one per 4-second window (the first, then one per window).
    assert 1 <= len(retries) <= 5, [r["msg"][:80] for r in retries]
    counted = [r for r in retries if r.get("suppressed")]
    assert counted and "more like this not logged in the last 4 s" in counted[0]["msg"], retries
    assert sum(r["suppressed"] for r in counted) >= 5, counted
