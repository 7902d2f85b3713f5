"""A job credential is good for the run it was given to: the job, the attempt, and the backend
job of that attempt, which is a pool *and* an id (issue #45, finding 5; docs/security.md 45.5).

The credential is minted before the backend job exists (it is in the job's environment at
submit), so it names the job and the attempt; a later attempt accepts it only while the same
backend job runs on (Kueue's requeue of the same Job). The review's case: a retry that landed
on another pool whose backend happened to hand out the same id.
"""

from __future__ import annotations

import pytest
from sqlalchemy import update

from gateway.kit.timeutil import utcnow
from gateway.models.jobs import Job, JobAttempt

BODY = {"name": "ckpt", "account": "team-a", "command": ["true"], "gpus_per_worker": 1, "time_limit": "10m"}


def _running_at_attempt_2(gw, first_pool: str) -> str:
    """A job now at attempt 2, running as job 17 of pool-b; attempt 1 ran as job 17 of ``first_pool``."""
    r = gw.client.post("/v1/jobs", json=BODY, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    now = utcnow()
    with gw.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(state="running", pool="pool-b", backend_job_id="17",
                                                             attempt=2, started_at=now))
        s.add(JobAttempt(job_id=job_id, number=1, pool=first_pool, backend_job_id="17", started_at=now,
                         ended_at=now, outcome="node_failure", reason="test"))
        s.commit()
    return job_id


def _report(gw, job_id: str, attempt: int):
    token = gw.app.state.job_credentials.token(job_id, attempt)
    return gw.client.post(f"/v1/jobs/{job_id}/checkpoints", json={"step": 5},
                          headers={"Authorization": f"Bearer {token}"})


def test_an_earlier_attempts_credential_is_refused_when_the_retry_runs_on_another_pool_with_the_same_id(gw):
    job_id = _running_at_attempt_2(gw, first_pool="pool-a")
    r = _report(gw, job_id, 1)
    assert r.status_code == 409, r.text
    assert "attempt 1's" in r.json()["detail"]
    job = gw.client.get(f"/v1/jobs/{job_id}", headers=gw.headers("alice", ("team-a",))).json()
    assert job["checkpoint_at"] is None
    assert _report(gw, job_id, 2).status_code == 201  # the current attempt's own credential


@pytest.mark.parametrize("attempt", [1, 2])
def test_the_same_backend_job_run_again_keeps_its_credential(gw, attempt):
    job_id = _running_at_attempt_2(gw, first_pool="pool-b")
    r = _report(gw, job_id, attempt)
    assert r.status_code == 201, r.text
    assert r.json()["attempt"] == 2
