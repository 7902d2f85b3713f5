"""The retry policy's rules through the API, on real Slurm 24.11, on SQLite and Postgres
(docs/recovery.md): a job's own exit is retried only when its spec asks, each attempt is a
new Slurm job admitted afresh (the ledger's released-then-reserved-again path of each
dialect), and a policy the gateway cannot follow is refused naming the field."""

from __future__ import annotations

import pytest

from gateway.ledger import reading as ledger_reading
from gateway.ledger.repository import list_entries
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    slurm_env,
    wired_gateway,
)
from tests.pools.test_five_pools import FINAL

pytestmark = [pytest.mark.slurm("24.11"), pytest.mark.both_databases]


@pytest.fixture(scope="module")
def gw(database_url, dev_key_path):
    backends = {"slurm-24": {"kind": "slurm", **slurm_backend_options(slurm_env("24.11"))}}
    with wired_gateway(database_url, dev_key_path, backends) as gw:
        gw.admin = gw.headers("root", admin=True)
        yield gw


def submit(gw, **spec) -> dict:
    body = {"name": "rules", "account": "team-a", "workers": 1, "gpus_per_worker": 8, "time_limit": "5m", **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    return r.json()


def test_a_jobs_own_exit_is_retried_only_when_it_asks(gw):
    default = submit(gw, command=["sh", "-c", "exit 3"])
    asked = submit(gw, retry={"max_attempts": 2, "on": ["exit_code"], "exit_codes": [3]},
                   command=["sh", "-c", 'echo "attempt $ISTHMUS_ATTEMPT"; exit 3'])
    other = submit(gw, retry={"max_attempts": 2, "on": ["exit_code"], "exit_codes": [3]}, command=["sh", "-c", "exit 4"])
    ids = [j["id"] for j in (default, asked, other)]
    assert drive_until(gw, lambda: all(job_state(gw, j, *FINAL) for j in ids), timeout_s=120)
    plain, retried, not_listed = (gw.client.get(f"/v1/jobs/{j}", headers=gw.admin).json() for j in ids)
    assert plain["state"] == "failed" and plain["attempt"] == 1 and plain["attempts"] is None, plain
    assert not_listed["state"] == "failed" and not_listed["exit_code"] == 4 and not_listed["attempt"] == 1
    assert retried["state"] == "failed" and retried["exit_code"] == 3 and retried["attempt"] == 2, retried
    (first,) = retried["attempts"]
    assert (first["number"], first["outcome"], first["exit_code"]) == (1, "exit_code", 3), first
    assert first["backend_job_id"] != retried["backend_job_id"], retried
    out = gw.client.get(f"/v1/jobs/{asked['id']}/logs", params={"worker": 0}, headers=gw.admin).text
    assert out.strip() == "attempt 2", out
    with gw.app.state.sessionmaker() as s:
        assert ledger_reading.verify(s) == []
        kinds = [e.kind for e in list_entries(s, job_id=asked["id"])]
    assert kinds.count("reserve") == 2 and kinds.count("release") == 2, kinds  # one admission per attempt


def test_a_retry_policy_the_gateway_cannot_follow_is_refused_naming_the_field(gw):
    for retry, field in (({"max_attempts": 11}, "body.retry.max_attempts"),
                         ({"max_attempts": 0}, "body.retry.max_attempts"),
                         ({"max_attempts": 2, "on": ["evicted"]}, "body.retry.on.0"),
                         ({"max_attempts": 2, "exit_codes": [3]}, "body.retry.exit_codes"),
                         ({"max_attempts": 2, "on": ["exit_code"], "exit_codes": [0]}, "body.retry.exit_codes.0"),
                         ({"max_attempts": 2, "when": "always"}, "body.retry.when")):
        r = gw.client.post("/v1/jobs", json={"name": "bad", "account": "team-a", "command": ["true"], "retry": retry},
                           headers=gw.headers("alice", ("team-a",)))
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
        assert [e["field"] for e in r.json()["errors"]] == [field], (retry, r.json())
