"""Guarantees, borrowing and reclaim with a grace signal (#30, docs/recovery.md) on real Slurm 24.11.

team-a is guaranteed 16 GPUs (two of the cluster's four 8-GPU nodes); team-b has no
guarantee, so all its work runs borrowed. team-a's first job and two of team-b's fill three
nodes. Once they have run the minimum runtime, team-b starts a third job on the last node:
it reports a checkpoint at once, so it has the least at risk of all, but it is younger than
the minimum runtime. One of the older two reports a checkpoint through the job credential
the gateway gave it (its own ISTHMUS_URL, ISTHMUS_JOB_TOKEN), the other never does. Then
team-a, within its guarantee, submits a gang that fits nowhere:

- the gateway chooses one victim, the old borrowed job with the least work since its
  checkpoint, never the young one nor team-a's own;
- the victim gets SIGUSR1 (its script traps it, saves its state and writes a line), then, at
  the end of the grace period, the gateway cancels it (SIGTERM to its steps: another line);
- its attempt ends ``preempted``, it waits again in its place in line, and team-a's gang
  starts on its node;
- when a node frees up, the victim's attempt 2 resumes from the state attempt 1 saved;
- nothing within a guarantee is ever stopped, and the ledger charged each attempt's run.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from tests.conftest import REPO, missing_system, postgres_database
from tests.dispatch.conftest import drive_until, job_state, wired_gateway
from tests.jobs.live import free_port, served
from tests.pools.test_five_pools import FINAL, five_pools  # noqa: F401  (five_pools: a fixture)
from tests.ui.test_pages import SECRET as UI_SECRET
from tests.ui.test_pages import page_as

pytestmark = [pytest.mark.slurm("24.11"), pytest.mark.postgres]

SHARED = REPO / ".stack" / "shared"
RUN = secrets.token_hex(4)
POOL = "slurm-24"
MIN_RUNTIME_S, GRACE_S = 15, 10

# The training script every job runs (from the shared file system): it appends what happens
# to a log in its checkpoint directory, saves its state on SIGUSR1, stops on SIGTERM, and an
# attempt that finds a saved state resumes from it and ends. REPORT_AT: the second at which
# it reports a committed checkpoint through its job credential (0: never).
SCRIPT = r'''#!/bin/sh
d="$ISTHMUS_CHECKPOINT_DIR"; n="$ISTHMUS_ATTEMPT"; i=0
log() { echo "$(date +%s) attempt $n $*" >> "$d/log"; }
if [ -e "$d/state" ]; then log "resumes from $(cat "$d/state")"; cat "$d/log"; exit 0; fi
trap 'log "got USR1, saving step $i"; echo "step $i" > "$d/state.tmp"; mv "$d/state.tmp" "$d/state"' USR1
trap 'log "got TERM"; exit 143' TERM
log "starts (grace $ISTHMUS_PREEMPT_GRACE_S s)"
while :; do
  i=$((i + 1)); sleep 1
  if [ "$i" = "$REPORT_AT" ]; then
    python3 -c 'import os, urllib.request as u
r = u.Request(os.environ["ISTHMUS_URL"] + "/v1/jobs/" + os.environ["ISTHMUS_JOB_ID"] + "/checkpoints",
              data=b"{\"step\": 1}", method="POST", headers={"Content-Type": "application/json",
              "Authorization": "Bearer " + os.environ["ISTHMUS_JOB_TOKEN"]})
print(u.urlopen(r).status)' >> "$d/log" 2>&1
  fi
done
'''


@pytest.fixture(scope="module")
def root():
    if not SHARED.is_dir():
        missing_system(f"{SHARED} missing: the test stack is not up (stack/up.sh)")
    base = SHARED / f"reclaim-{RUN}"
    (base / "ckpt").mkdir(parents=True)
    (base / "ckpt").chmod(0o1777)
    script = base / "train.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    base.chmod(0o755)
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture(scope="module")
def gw(five_pools, root, dev_key_path, tmp_path_factory):
    pool = next(p for p in five_pools if p["name"] == POOL)
    path = tmp_path_factory.mktemp("reclaim") / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": [pool], "storage": [
        {"name": "ckpt", "path": str(root / "ckpt"), "mode": "read-write", "pools": {POOL: {}}}]}))
    port = free_port()
    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, pools_file=str(path), preempt_min_runtime_s=MIN_RUNTIME_S,
                          preempt_grace_s=GRACE_S, job_api_url=f"http://127.0.0.1:{port}",
                          ui_session_secret=UI_SECRET) as gw, \
            served(gw.app, port=port):
        gw.admin = gw.headers("root", admin=True)
        r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"guaranteed_gpus": 16}, headers=gw.admin)
        assert r.status_code == 200, r.text
        assert r.json()["quota"]["guaranteed_gpus"] == {"value": 16, "source": "team-a"}
        yield gw


def submit(gw, root: Path, who: str, name: str, report_at: int = 0) -> dict:
    account = {"alice": "team-a", "bob": "team-b"}[who]
    r = gw.client.post("/v1/jobs", json={
        "name": name, "account": account, "workers": 1, "gpus_per_worker": 8, "time_limit": "10m",
        "checkpoint": {"storage": "ckpt"}, "env": {"REPORT_AT": str(report_at)},
        "command": ["/bin/sh", str(root / "train.sh")]}, headers=gw.headers(who, (account,)))
    assert r.status_code == 202, r.text
    return r.json()


def get(gw, job: dict) -> dict:
    return gw.client.get(f"/v1/jobs/{job['id']}", headers=gw.admin).json()


def events(gw, job: dict) -> list[dict]:
    return gw.client.get(f"/v1/jobs/{job['id']}/events", headers=gw.admin).json()["items"]


def log_lines(job: dict) -> list[str]:
    path = Path(job["checkpoint_dir"]) / "log"
    return path.read_text().splitlines() if path.is_file() else []


def test_a_guaranteed_gang_reclaims_the_borrowed_job_with_least_progress_at_risk(gw, root):
    a0 = submit(gw, root, "alice", "a0")
    b_never = submit(gw, root, "bob", "b-never")
    b_reports = submit(gw, root, "bob", "b-reports", report_at=10)
    first = [a0, b_never, b_reports]
    running = drive_until(gw, lambda: all(job_state(gw, j["id"], "running") for j in first) and
                          [get(gw, j) for j in first], timeout_s=120)
    assert [j["borrowed"] for j in running] == [False, True, True], running
    # The report came from inside the job, with its own credential.
    try:
        drive_until(gw, lambda: get(gw, b_reports)["checkpoint_at"], timeout_s=60)
    except AssertionError:
        raise AssertionError(f"no checkpoint report: {log_lines(get(gw, b_reports))}") from None
    assert any(e["kind"] == "checkpoint" and e["actor"] == f"job:{b_reports['id']}" for e in events(gw, b_reports))
    assert "201" in log_lines(get(gw, b_reports))
    # A job credential is good for that job's checkpoint call and nothing else.
    token = gw.app.state.job_credentials.token(b_never["id"], 1)
    assert gw.client.get(f"/v1/jobs/{b_never['id']}", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    r = gw.client.post(f"/v1/jobs/{b_reports['id']}/checkpoints", json={}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401, r.text
    assert get(gw, b_never)["checkpoint_at"] is None

    # Past the minimum runtime, a young borrowed job takes the last node and reports at once.
    while time.time() - min(_ts(j["started_at"]) for j in running[1:]) < MIN_RUNTIME_S + 1:
        gw.app.state.dispatcher.run_once()
        time.sleep(1)
    b_young = submit(gw, root, "bob", "b-young", report_at=1)
    drive_until(gw, lambda: job_state(gw, b_young["id"], "running") and get(gw, b_young)["checkpoint_at"],
                timeout_s=60)

    # team-a's gang, within its guarantee (8 of 16 held), fits nowhere: one borrowed job goes.
    a1 = submit(gw, root, "alice", "a1")
    chosen = drive_until(gw, lambda: get(gw, b_reports)["preemption"], timeout_s=30)
    assert chosen["preemptor_id"] == a1["id"] and chosen["preemptor_account"] == "team-a", chosen
    for j in (a0, b_never, b_young):
        assert get(gw, j)["preemption"] is None, j["name"]
    # The victim's page says so: borrowed, what is at risk since its report, and why it stops.
    page = page_as(gw, gw.headers("bob", ("team-b",)), f"/ui/jobs/{b_reports['id']}")
    assert 'id="borrowed"' in page and "since its last checkpoint report" in page, page
    assert "Being preempted: preempted: chosen to stop so that team-a&#39;s job" in page, page
    page = page_as(gw, gw.headers("alice", ("team-a",)), f"/ui/jobs/{a0['id']}")
    assert 'id="borrowed"' not in page and "since it started (no checkpoint reported)" in page, page
    waiting = [e["reason"] for e in events(gw, a1) if e["kind"] == "waiting"]
    assert waiting[0].startswith(
        "reclaiming borrowed GPUs to start team-a's gang (8 GPUs) within its guarantee on slurm-24: stops 1 borrowed "
        f"job of team-b: {b_reports['id']}"), waiting

    # The signal, then the stop at the deadline, then attempt 1 ends preempted; team-a's gang starts.
    started = drive_until(gw, lambda: job_state(gw, a1["id"], "running"), timeout_s=90)
    victim = get(gw, b_reports)
    assert victim["attempt"] == 2 and victim["state"] in ("pending", "dispatching", "queued"), victim
    (attempt1,) = victim["attempts"]
    assert attempt1["outcome"] == "preempted" and attempt1["charged_gpu_hours"] > 0, attempt1
    assert started["nodes"] == attempt1["nodes"], (started, attempt1)
    lines = log_lines(victim)
    usr1 = next(int(line.split()[0]) for line in lines if "attempt 1 got USR1, saving" in line)
    term = next(int(line.split()[0]) for line in lines if "attempt 1 got TERM" in line)
    assert GRACE_S - 2 <= term - usr1 <= GRACE_S + 15, lines
    said = [e["reason"] for e in events(gw, b_reports)]
    assert any(r.startswith(f"preempted: chosen to stop so that team-a's job {a1['id']} (8 GPUs), within its "
                            "guarantee, can start on slurm-24. This job runs on borrowed GPUs") for r in said), said
    assert any(r.startswith(f"SIGUSR1 sent to Slurm job {attempt1['backend_job_id']}") for r in said), said
    assert any(f"preempted to start team-a's job {a1['id']} within its guarantee" in r for r in said), said
    assert started["borrowed"] is False

    # A node frees up: attempt 2 resumes from what attempt 1 saved.
    gw.client.post(f"/v1/jobs/{b_never['id']}/cancel", headers=gw.admin)
    done = drive_until(gw, lambda: job_state(gw, b_reports["id"], *FINAL), timeout_s=120)
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    out = gw.client.get(f"/v1/jobs/{b_reports['id']}/logs", params={"worker": 0}, headers=gw.admin).text
    assert "attempt 2 resumes from step" in out, out

    # Nothing within a guarantee was ever stopped; every attempt's run was charged.
    for j in (a0, a1):
        assert get(gw, j)["attempt"] == 1 and get(gw, j)["preemption"] is None
    for j in (a0, a1, b_young):
        gw.client.post(f"/v1/jobs/{j['id']}/cancel", headers=gw.admin)
    drive_until(gw, lambda: all(job_state(gw, j["id"], *FINAL) for j in (a0, a1, b_young, b_never)), timeout_s=90)
    with gw.app.state.sessionmaker() as s:
        assert ledger_reading.verify(s) == []
        # charged_gpu_hours is rounded to 6 decimals (0.0018 s): 240 s shows as 0.066667 h (240.0012 s).
        assert ledger_rules.charged_gpu_seconds(s, job_id=b_reports["id"]) >= attempt1["charged_gpu_hours"] * 3600 - 0.002


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def test_a_reclaim_is_called_off_when_the_job_it_makes_room_for_stops_waiting(gw, root):
    """Issue #45, finding 3: team-a submits within its guarantee, a borrowed job of team-b is
    chosen and signalled, then team-a cancels. Before the fix team-b's job was still cancelled
    at the deadline, its attempt lost for nothing; now the reclaim is called off and it runs on."""
    left = [j["id"] for j in gw.client.get("/v1/jobs", params={"limit": 500}, headers=gw.admin).json()["items"]
            if j["state"] not in FINAL]
    for job_id in left:  # what the test before left running: this one needs the pool to itself
        gw.client.post(f"/v1/jobs/{job_id}/cancel", headers=gw.admin)
    drive_until(gw, lambda: all(job_state(gw, j, *FINAL) for j in left), timeout_s=90)
    a0 = submit(gw, root, "alice", "off-a0")
    bs = [submit(gw, root, "bob", f"off-b{i}") for i in range(3)]
    running = drive_until(gw, lambda: all(job_state(gw, j["id"], "running") for j in [a0, *bs]) and
                          [get(gw, j) for j in bs], timeout_s=120)
    while time.time() - min(_ts(j["started_at"]) for j in running) < MIN_RUNTIME_S + 1:
        gw.app.state.dispatcher.run_once()
        time.sleep(1)
    a1 = submit(gw, root, "alice", "off-a1")
    victim = drive_until(gw, lambda: next((j for j in bs if get(gw, j)["preemption"]), None), timeout_s=30)
    assert gw.client.post(f"/v1/jobs/{a1['id']}/cancel", headers=gw.headers("alice", ("team-a",))).status_code == 202
    deadline = time.monotonic() + GRACE_S + 8  # well past the victim's deadline
    while time.monotonic() < deadline:
        gw.app.state.dispatcher.run_once()
        time.sleep(0.5)

    after = get(gw, victim)
    assert after["state"] == "running" and after["attempt"] == 1 and after["preemption"] is None, after
    said = [e["reason"] for e in events(gw, victim)]
    assert any(r.startswith(f"reclaim called off: team-a's job {a1['id']} is cancelled: it no longer waits "
                            "for this room. This job keeps running") for r in said), said
    assert not any("got TERM" in line for line in log_lines(after)), log_lines(after)
    for j in (a0, *bs):
        gw.client.post(f"/v1/jobs/{j['id']}/cancel", headers=gw.admin)
    drive_until(gw, lambda: all(job_state(gw, j["id"], *FINAL) for j in (a0, *bs)), timeout_s=90)
    with gw.app.state.sessionmaker() as s:
        assert ledger_reading.verify(s) == []
