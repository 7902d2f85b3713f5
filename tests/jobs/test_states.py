"""The state machine: legal moves work and are recorded; illegal ones are impossible."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.jobs import service
from gateway.jobs.models import Job, JobEvent
from gateway.jobs.states import TRANSITIONS, IllegalTransition, JobState

SPEC = {"name": "s", "account": "team-a", "command": ["true"]}


def _job(gw) -> str:
    return gw.client.post("/v1/jobs", json=SPEC, headers=gw.headers()).json()["id"]


def test_final_states_have_no_exit():
    for s in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert TRANSITIONS[s] == frozenset()
    assert set(TRANSITIONS) == set(JobState)


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
