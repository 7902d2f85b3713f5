"""Attempts and retries owned by the gateway (#30, docs/recovery.md), on the real systems.

Real Slurm 24.11: a 2-node gang is running; an operator sets one of its nodes DOWN; Slurm
ends the job NODE_FAIL (the gateway submits jobs non-requeueable; Slurm 22.05's REST API
ignores that flag and requeues the job itself, docs/slurm.md); the gateway records the
attempt, queues the job again in its own line, and runs it on the nodes that are left; the
second attempt finds in its checkpoint directory what the first wrote; the ledger charged
both runs and nothing else, and still balances. A gang its cluster can no longer hold runs
again on another cluster with the same storage. (tests/recovery/test_retry_rules.py: exit
codes and refusals, on SQLite and Postgres.)
"""

from __future__ import annotations

import secrets
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from gateway.models.jobs import Job
from tests import slurm_cli
from tests.conftest import REPO, missing_system, postgres_database
from tests.dispatch.conftest import drive_until, job_state, slurm_env, wired_gateway
from tests.dispatch.test_slurm_e2e import scontrol
from tests.pools.test_five_pools import FINAL, five_pools  # noqa: F401  (five_pools: a fixture)
from tests.ui.test_pages import (
    SECRET as UI_SECRET,  # the /ui session cookies of tests/ui
)
from tests.ui.test_pages import page_as

pytestmark = [pytest.mark.slurm("24.11", "26.05"), pytest.mark.postgres]

SHARED = REPO / ".stack" / "shared"
RUN = secrets.token_hex(4)
POOL, VERSION = "slurm-24", "24.11"  # its REST API honours requeue=false


@pytest.fixture(scope="module")
def root():
    if not SHARED.is_dir():
        missing_system(f"{SHARED} missing: the test stack is not up (stack/up.sh)")
    base = SHARED / f"r-{RUN}" / "ckpt"
    base.mkdir(parents=True)
    base.chmod(0o1777)
    yield base
    subprocess.run(["rm", "-rf", str(base.parent)], check=False)


@pytest.fixture(scope="module")
def gw(five_pools, root, dev_key_path, tmp_path_factory):
    pool = next(p for p in five_pools if p["name"] == POOL)
    path = tmp_path_factory.mktemp("recovery") / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": [pool], "storage": [
        {"name": "ckpt", "path": str(root), "mode": "read-write", "pools": {POOL: {}}}]}))
    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, pools_file=str(path), ui_session_secret=UI_SECRET) as gw:
        gw.admin = gw.headers("root", admin=True)
        yield gw


def submit(gw, **spec) -> dict:
    body = {"name": "retry", "account": "team-a", "workers": 1, "gpus_per_worker": 8, "time_limit": "5m",
            "checkpoint": {"storage": "ckpt"}, **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    return r.json()


def get(gw, job_id: str) -> dict:
    return gw.client.get(f"/v1/jobs/{job_id}", headers=gw.admin).json()


def resume(env: dict[str, str], node: str) -> None:
    """Back in service (the cluster may have returned it already: ReturnToService)."""
    slurm_cli.run(env, "scontrol", "update", f"nodename={node}", "state=resume", check=False)


def seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def test_a_gang_whose_node_fails_runs_again_elsewhere_and_resumes_from_its_checkpoint(gw):
    # Each worker leaves a mark for its attempt; the second attempt shows the first's marks.
    job = submit(gw, workers=2, command=["sh", "-c",
        ('touch "$ISTHMUS_CHECKPOINT_DIR/attempt-$ISTHMUS_ATTEMPT-$SLURMD_NODENAME"; '
        'if [ "$ISTHMUS_ATTEMPT" = 1 ]; then exec sleep 300; fi; '
        'echo "attempt $ISTHMUS_ATTEMPT on $SLURMD_NODENAME finds:" $(cd "$ISTHMUS_CHECKPOINT_DIR" && ls attempt-1-*)')])
    running = drive_until(gw, lambda: job_state(gw, job["id"], "running"), timeout_s=90)
    ckpt = Path(job["checkpoint_dir"])
    drive_until(gw, lambda: len(list(ckpt.glob("attempt-1-*"))) == 2, timeout_s=30)
    time.sleep(3)  # attempt 1 runs a few seconds: its charge is measurable
    failed_node = running["nodes"][1]
    env = slurm_env(VERSION)
    scontrol(env, "update", f"nodename={failed_node}", "state=down", "reason=isthmus-test-node-failure")
    try:
        # A failed node stays out of service until repaired (this cluster's ReturnToService
        # would take it back at once; drained, it takes no new job).
        scontrol(env, "update", f"nodename={failed_node}", "state=drain", "reason=isthmus-test-node-failure")
        retried = drive_until(gw, lambda: (j := get(gw, job["id"]))["attempt"] == 2 and j, timeout_s=90)
        assert retried["state"] in ("pending", "dispatching", "queued", "starting", "running"), retried
        time.sleep(5)  # ... and then waits: that time must not be charged
        done = drive_until(gw, lambda: job_state(gw, job["id"], *FINAL), timeout_s=120)
    finally:
        resume(env, failed_node)
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    (first,) = done["attempts"]
    assert first["number"] == 1 and first["outcome"] == "node_failure" and "NODE_FAIL" in first["reason"], first
    assert first["nodes"] == running["nodes"] and first["backend_job_id"] == running["backend_job_id"], first
    assert failed_node not in done["nodes"] and done["backend_job_id"] != first["backend_job_id"], done
    # The same checkpoint directory, with the first attempt's files in it.
    assert done["checkpoint_dir"] == job["checkpoint_dir"]
    marks = " ".join(sorted(f"attempt-1-{n}" for n in running["nodes"]))
    out = gw.client.get(f"/v1/jobs/{job['id']}/logs", params={"worker": 0}, headers=gw.admin).text
    assert out.strip().endswith(f"finds: {marks}"), out
    # Where people look: the job's page and `isthmus job`.
    html = page_as(gw, gw.headers("alice", ("team-a",)), f"/ui/jobs/{job['id']}")
    assert f'<tr class="attempt"><td>1</td><td>{POOL}</td><td>{", ".join(running["nodes"])}</td>' in html, html
    assert "This is attempt 2." in html and "node failure: NODE_FAIL" in html
    from gateway.cli_user import _job_detail

    detail = _job_detail(done)
    assert "attempt:           2" in detail and f"  attempt 1: node_failure on {POOL} ({','.join(running['nodes'])})" \
        in detail, detail
    # Why, in words, in the job's history.
    events = gw.client.get(f"/v1/jobs/{job['id']}/events", headers=gw.admin).json()["items"]
    retry = next(e for e in events if e.get("to_state") == "pending" and e.get("from_state"))
    assert retry["reason"].startswith(f"attempt 1 on {POOL} ended: a node failed under it"), retry
    assert "attempt 2 of at most 3" in retry["reason"], retry
    # The ledger charged each run (16 GPUs: two whole nodes), never the time in between, and balances.
    with gw.app.state.sessionmaker() as s:
        held = s.get(Job, job["id"]).held_gpus
        charged = ledger_rules.charged_gpu_seconds(s, job_id=job["id"])
        assert ledger_reading.verify(s) == []
    run1 = seconds(first["started_at"], first["ended_at"]) * held
    run2 = seconds(done["started_at"], done["ended_at"]) * held
    assert abs(first["charged_gpu_hours"] * 3600 - run1) <= held, (first, run1)
    assert abs(charged - (run1 + run2)) <= 2 * held, (charged, run1, run2)
    between = seconds(first["ended_at"], done["started_at"]) * held
    assert between >= 5 * held and run1 >= 2 * held, (between, run1)  # the wait was not charged (above)


VERSIONS = {"slurm-24": "24.11", "slurm-26": "26.05"}  # REST APIs that honour requeue=false


@pytest.fixture(scope="module")
def gw2(five_pools, root, dev_key_path, tmp_path_factory):
    """Two Slurm clusters that both have the checkpoint storage (the shared directory)."""
    pools = [p for p in five_pools if p["name"] in VERSIONS]
    path = tmp_path_factory.mktemp("recovery2") / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": pools, "storage": [
        {"name": "ckpt", "path": str(root), "mode": "read-write", "pools": {v: {} for v in VERSIONS}}]}))
    with postgres_database(migrated=True) as url, wired_gateway(url, dev_key_path, {}, pools_file=str(path)) as gw:
        gw.admin = gw.headers("root", admin=True)
        yield gw


def test_a_gang_its_cluster_can_no_longer_hold_runs_again_on_another(gw2):
    """Four whole nodes: when one of its cluster's four fails, attempt 2 cannot start there,
    and goes to the other cluster, which has the same checkpoint storage."""
    job = submit(gw2, workers=4, command=["sh", "-c",
        ('touch "$ISTHMUS_CHECKPOINT_DIR/attempt-$ISTHMUS_ATTEMPT-$SLURMD_NODENAME"; '
        'if [ "$ISTHMUS_ATTEMPT" = 1 ]; then exec sleep 300; fi; '
        'echo "attempt $ISTHMUS_ATTEMPT finds" $(cd "$ISTHMUS_CHECKPOINT_DIR" && ls attempt-1-* | wc -l) marks')])
    running = drive_until(gw2, lambda: job_state(gw2, job["id"], "running"), timeout_s=90)
    first_pool, failed_node = running["assigned_pool"], running["nodes"][0]
    env = slurm_env(VERSIONS[first_pool])
    scontrol(env, "update", f"nodename={failed_node}", "state=down", "reason=isthmus-test-node-failure")
    try:
        scontrol(env, "update", f"nodename={failed_node}", "state=drain", "reason=isthmus-test-node-failure")
        done = drive_until(gw2, lambda: job_state(gw2, job["id"], *FINAL), timeout_s=150)
    finally:
        resume(env, failed_node)
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    (first,) = done["attempts"]
    assert (first["pool"], first["outcome"]) == (first_pool, "node_failure"), first
    assert done["assigned_pool"] == next(p for p in VERSIONS if p != first_pool), done
    assert f"routed to {done['assigned_pool']}" in done["routing_reason"], done["routing_reason"]
    out = gw2.client.get(f"/v1/jobs/{job['id']}/logs", params={"worker": 0}, headers=gw2.admin).text
    assert out.strip() == "attempt 2 finds 4 marks", out
    with gw2.app.state.sessionmaker() as s:
        assert ledger_reading.verify(s) == []
