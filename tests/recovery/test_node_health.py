"""Node health on real Slurm 25.11 (issue #48, docs/recovery.md "Node health").

A node set DOWN under a running gang is recorded, blamed on that node alone (Slurm says which
one is down), and the retry runs on other nodes: Slurm's own job record shows the exclusion,
even with the node back in service. A node that failed two accounts' gangs is drained by the
gateway with its reason, no gang is placed on it, and an admin's clear resumes it in Slurm.
"""

from __future__ import annotations

import json
import time

import pytest

from gateway.webhooks.worker import WebhookWorker
from tests import slurm_cli
from tests.conftest import postgres_database
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    slurm_env,
    wired_gateway,
)
from tests.ui.test_pages import SECRET as UI_SECRET
from tests.ui.test_pages import page_as
from tests.webhooks.conftest import ALLOWLIST, pki, receiver, verify  # noqa: F401  (pki, receiver: fixtures)

pytestmark = [pytest.mark.slurm("25.11"), pytest.mark.postgres]

FINAL = ("succeeded", "failed", "cancelled")
TEST_REASON = "isthmus-test-node-failure"


@pytest.fixture
def gw(dev_key_path, request):
    slurm_cluster = slurm_env(request.node.get_closest_marker("slurm").args[0])
    options = {**slurm_backend_options(slurm_cluster), "drain_suspect_nodes": True}
    with postgres_database(migrated=True) as url, wired_gateway(url, dev_key_path, {"slurm": options},
                                                                          ui_session_secret=UI_SECRET) as gw:
        gw.admin = gw.headers("root", admin=True)
        gw.env = slurm_cluster
        try:
            yield gw
        finally:  # whatever a test left down or drained is back in service for the next module
            for node in nodes_of(slurm_cluster):
                slurm_cli.run(slurm_cluster, "scontrol", "update", f"nodename={node}", "state=resume", check=False)


def nodes_of(env) -> list[str]:
    out = slurm_cli.run(env, "sinfo", "-h", "-N", "-p", env["SLURM_PARTITION"], "-o", "%N").stdout
    return sorted(set(out.split()))


def node_line(env, node: str) -> str:
    """``scontrol show node`` as one line: State=..., Reason=..."""
    return " ".join(slurm_cli.run(env, "scontrol", "show", "node", node).stdout.split())


def job_line(env, backend_job_id: str) -> str:
    return " ".join(slurm_cli.run(env, "scontrol", "show", "job", backend_job_id).stdout.split())


def submit(gw, account: str, **spec) -> str:
    body = {"name": "health", "account": account, "backend": "slurm", "gpus_per_worker": 8, "time_limit": "5m",
            "workers": 1, "command": ["sleep", "2"], **spec}
    who = {"team-a": "alice", "team-b": "bob"}[account]
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers(who, (account,)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def get(gw, job_id: str) -> dict:
    return gw.client.get(f"/v1/jobs/{job_id}", headers=gw.admin).json()


def events(gw, job_id: str) -> str:
    r = gw.client.get(f"/v1/jobs/{job_id}/events", headers=gw.admin)
    assert r.status_code == 200, r.text
    return " | ".join(e["reason"] for e in r.json()["items"])


def record(gw, **params) -> dict[str, dict]:
    r = gw.client.get("/v1/admin/nodes", params={"pool": "slurm", **params}, headers=gw.admin)
    assert r.status_code == 200, r.text
    return {n["node"]: n for n in r.json()}


def fail_node_under(gw, job_id: str, node: str) -> None:
    """Take ``node`` down under the job's gang (as tests/recovery/test_retry.py does); return once
    the gateway has seen the attempt end, then put the node back in service as its operator
    would after a repair (the cluster's ReturnToService would, too)."""
    attempt = get(gw, job_id)["attempt"]
    slurm_cli.run(gw.env, "scontrol", "update", f"nodename={node}", "state=down", f"reason={TEST_REASON}")
    # Out of service until repaired: the cluster's ReturnToService would take it back at once.
    slurm_cli.run(gw.env, "scontrol", "update", f"nodename={node}", "state=drain", f"reason={TEST_REASON}")
    drive_until(gw, lambda: (j := get(gw, job_id))["attempt"] > attempt or j["state"] in FINAL, timeout_s=120)
    slurm_cli.run(gw.env, "scontrol", "update", f"nodename={node}", "state=resume", check=False)


def test_the_retry_after_a_node_failure_avoids_that_node_even_when_it_is_back(gw):
    job = submit(gw, "team-a", workers=3, command=[
        "sh", "-c", 'if [ "$ISTHMUS_ATTEMPT" = 1 ]; then exec sleep 300; fi; sleep 2'])
    running = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=90)
    bad = running["nodes"][0]
    time.sleep(2)  # a measurable run: what the failure cost goes on the node's record
    fail_node_under(gw, job, bad)
    assert "State=IDLE" in node_line(gw.env, bad) or "State=MIXED" not in node_line(gw.env, bad)
    done = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=120)
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    (first,) = done["attempts"]
    assert first["outcome"] == "node_failure" and first["nodes"] == running["nodes"], first
    # The retry ran elsewhere because it was told to: Slurm's record of it excludes the node.
    assert bad not in done["nodes"], done
    assert f"ExcNodeList={bad}" in job_line(gw.env, done["backend_job_id"]), job_line(gw.env, done["backend_job_id"])
    assert f"avoiding node(s) {bad}" in events(gw, job), events(gw, job)
    # The record blames the node Slurm had down, not the gang's other nodes, and says what it cost.
    nodes = record(gw)
    assert nodes[bad]["failures"] == 1 and nodes[bad]["accounts"] == ["team-a"], nodes[bad]
    assert nodes[bad]["lost_gpu_hours"] > 0 and not nodes[bad]["suspect"], nodes[bad]
    for other in running["nodes"][1:]:
        assert other not in nodes or nodes[other]["failures"] == 0, nodes[other]
    # One account's failure is not the node's fault: a new gang may land on it.
    assert not gw.app.state.dispatcher.node_watch.quarantined("slurm")


def test_a_node_that_fails_two_accounts_is_drained_and_avoided_until_an_admin_clears_it(gw, pki, receiver):
    # Admins hear of a quarantine through their webhook (signed like every delivery).
    gw.app.state.settings = gw.app.state.settings.model_copy(update={"webhook_allowlist": ALLOWLIST})
    r = gw.client.post("/v1/admin/webhooks", json={"url": receiver.url}, headers=gw.admin)
    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    hooks = WebhookWorker(sessions=gw.app.state.sessionmaker, settings=gw.app.state.settings.model_copy(update={
        "webhook_ca_file": str(pki.ca_file), "webhook_timeout_s": 5.0}).webhooks)
    everything = {"workers": 4, "command": ["sleep", "300"], "retry": {"max_attempts": 1}}
    first = submit(gw, "team-a", **everything)
    running = drive_until(gw, lambda: job_state(gw, first, "running"), timeout_s=90)
    bad = running["nodes"][-1]
    fail_node_under(gw, first, bad)
    assert get(gw, first)["state"] == "failed"
    assert not gw.app.state.dispatcher.node_watch.quarantined("slurm")  # one account so far
    second = submit(gw, "team-b", **everything)
    drive_until(gw, lambda: job_state(gw, second, "running"), timeout_s=90)
    fail_node_under(gw, second, bad)
    assert get(gw, second)["state"] == "failed"
    # The gateway drains it in Slurm, with its reason.
    drive_until(gw, lambda: "DRAIN" in node_line(gw.env, bad), timeout_s=30)
    line = node_line(gw.env, bad)
    assert "Reason=isthmus:" in line and "team-a" in line and "team-b" in line, line
    nodes = record(gw, suspect="true")
    assert list(nodes) == [bad], nodes
    hooks.run_once()
    got = receiver.wait_for(lambda rs: any(json.loads(x.body)["type"] == "node.quarantined" for x in rs), timeout=30)
    notice = next(x for x in got if json.loads(x.body)["type"] == "node.quarantined")
    assert verify(secret, notice.headers, notice.body), notice.headers
    data = json.loads(notice.body)["data"]
    assert data["node"] == bad and "team-b" in data["reason"], data
    assert nodes[bad]["accounts"] == ["team-a", "team-b"] and nodes[bad]["drained_at"], nodes[bad]
    # Every user sees it on the pool's page (without the reason, which names accounts); Prometheus too.
    pools = gw.client.get("/v1/pools", headers=gw.headers("alice", ("team-a",))).json()["items"]
    assert next(p for p in pools if p["name"] == "slurm")["quarantined_nodes"] == [bad], pools
    assert f'isthmus_node_quarantined{{node="{bad}",pool="slurm"}} 1.0' in gw.client.get("/metrics").text
    html = page_as(gw, gw.admin, "/ui/admin")
    assert f"/ui/admin/nodes/slurm/{bad}/clear" in html and "suspect: " in html, html
    # No gang is placed on it: the next one is told to avoid it.
    third = submit(gw, "team-a", workers=1, command=["sleep", "1"])
    done = drive_until(gw, lambda: job_state(gw, third, *FINAL), timeout_s=90)
    assert done["state"] == "succeeded" and bad not in done["nodes"], done
    assert f"ExcNodeList={bad}" in job_line(gw.env, done["backend_job_id"])
    # An admin clears it: back in service in Slurm, and no longer avoided.
    r = gw.client.post(f"/v1/admin/nodes/slurm/{bad}/clear", headers=gw.admin)
    assert r.status_code == 200, r.text
    assert not r.json()["suspect"] and r.json()["cleared_by"].endswith("root"), r.json()
    assert "DRAIN" not in node_line(gw.env, bad), node_line(gw.env, bad)
    pools = gw.client.get("/v1/pools", headers=gw.headers("alice", ("team-a",))).json()["items"]
    assert next(p for p in pools if p["name"] == "slurm")["quarantined_nodes"] == [], pools
    # The drain and the clear are on the audit log, with who did them.
    r = gw.client.get("/v1/admin/audit", params={"action": "pool.node.*"}, headers=gw.admin)
    assert r.status_code == 200, r.text
    done_by = {(x["action"], x["target_name"], x["subject"]) for x in r.json()["items"]}
    assert ("pool.node.drain", f"slurm/{bad}", "system:node-health") in done_by, done_by
    assert any(a == "pool.node.clear" and t == f"slurm/{bad}" and who.endswith("root") for a, t, who in done_by), done_by
    fourth = submit(gw, "team-b", workers=4, command=["sleep", "1"])
    done = drive_until(gw, lambda: job_state(gw, fourth, *FINAL), timeout_s=90)
    assert done["state"] == "succeeded" and bad in done["nodes"], done
    assert "avoiding" not in events(gw, fourth)


def test_clearing_a_node_the_record_never_saw_is_a_404_and_bad_names_are_refused(gw):
    r = gw.client.post("/v1/admin/nodes/nowhere/gpu1/clear", headers=gw.admin)
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json"), r.text
    r = gw.client.post("/v1/admin/nodes/slurm/gpu%3Bx/clear", headers=gw.admin)
    assert r.status_code == 422 and "node" in r.text, r.text
    r = gw.client.get("/v1/admin/nodes", headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 403, r.text
