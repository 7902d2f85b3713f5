"""The state machine: legal moves work and are recorded; illegal ones are impossible."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.domain.states import IllegalTransition, JobState
from gateway.jobs import service
from gateway.jobs.claims import Claims
from gateway.models.jobs import Job, JobEvent

SPEC = {"name": "s", "account": "team-a", "command": ["true"]}


def _job(gw) -> str:
    return gw.client.post("/v1/jobs", json=SPEC, headers=gw.headers()).json()["id"]


def test_full_lifecycle_is_recorded(gw):
    job_id = _job(gw)
    path = [JobState.DISPATCHING, JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.REQUEUED,
            JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED]
    with gw.session() as s, s.begin():
        job = s.get(Job, job_id)
        for target in path:
            assert service.set_state(s, job, target, actor="system:test", reason=f"to {target.value}")
    events = gw.client.get(f"/v1/jobs/{job_id}/events", headers=gw.headers()).json()["items"]
    assert [e["to_state"] for e in events] == ["pending"] + [p.value for p in path]
    assert all(e["from_state"] for e in events[1:])


@pytest.mark.parametrize("start,target", [
    (JobState.PENDING, JobState.RUNNING),
    (JobState.PENDING, JobState.SUCCEEDED),
    (JobState.CANCELLED, JobState.PENDING),
])
def test_illegal_transition_is_refused_and_nothing_written(gw, start, target):
    job_id = _job(gw)
    if start is JobState.CANCELLED:
        gw.client.post(f"/v1/jobs/{job_id}/cancel", headers=gw.headers())
    with gw.session() as s:
        n_events = len(s.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all())
        job = s.get(Job, job_id)
        with pytest.raises(IllegalTransition):
            service.set_state(s, job, target, actor="system:test")
        s.rollback()
    with gw.session() as s:
        assert s.get(Job, job_id).state == start.value
        assert len(s.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all()) == n_events


def test_direct_assignment_is_validated_too():
    job = Job(state="pending")
    with pytest.raises(IllegalTransition):
        job.state = "succeeded"
    job.state = "dispatching"
    assert job.state == "dispatching"


def test_the_bulk_claim_checks_every_change_against_the_table_before_it_writes_any(gw):
    """The dispatch round's writer (gateway/jobs/claims.py) applies the state machine too: a batch holding
    one illegal change (a cancelled job claimed) raises IllegalTransition, and none of it lands."""
    from datetime import timedelta

    from gateway.kit.timeutil import utcnow

    ok_id, cancelled_id = _job(gw), _job(gw)
    gw.client.post(f"/v1/jobs/{cancelled_id}/cancel", headers=gw.headers())
    with gw.session() as s:
        n_events = len(s.scalars(select(JobEvent)).all())
        writes = Claims(s)
        for job_id in (ok_id, cancelled_id):
            writes.claim(s.get(Job, job_id), pool="slurm", held_gpus=0, reason="routed to slurm",
                         lease_until=utcnow() + timedelta(seconds=60), actor="system:test")
        with pytest.raises(IllegalTransition, match="cancelled -> dispatching"):
            writes.flush()
        s.rollback()
    with gw.session() as s:
        assert (s.get(Job, ok_id).state, s.get(Job, cancelled_id).state) == ("pending", "cancelled")
        assert len(s.scalars(select(JobEvent)).all()) == n_events


def test_a_submission_is_recorded_by_one_call_whether_the_job_waited_for_it_or_was_cancelled_meanwhile(gw):
    """service.record_submission: a dispatching job becomes queued with the backend's id; one
    cancelled while the submission was in flight keeps its state, gets an event, and the caller
    is told to cancel the backend job."""
    waited, cancelled = _job(gw), _job(gw)
    with gw.session() as s, s.begin():
        for job_id in (waited, cancelled):
            service.set_state(s, s.get(Job, job_id), JobState.DISPATCHING, actor="system:test")
        service.set_state(s, s.get(Job, cancelled), JobState.CANCELLED, actor="dev:alice", reason="cancelled")
    with gw.session() as s, s.begin():
        finals = [service.record_submission(s, job_id=job_id, backend_job_id=f"b-{job_id}", actor="system:test",
                                            reason="submitted as slurm job 7", data={"adopted": False})
                  for job_id in (waited, cancelled)]
    assert finals == [False, True]
    with gw.session() as s:
        jobs = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_([waited, cancelled])))}
        assert (jobs[waited].state, jobs[waited].backend_job_id) == ("queued", f"b-{waited}")
        assert (jobs[cancelled].state, jobs[cancelled].backend_job_id) == ("cancelled", f"b-{cancelled}")
        last = s.scalars(select(JobEvent).where(JobEvent.job_id == cancelled).order_by(JobEvent.id.desc())).first()
        assert (last.kind, last.reason) == ("submitted", "submitted as slurm job 7; cancelling it")
