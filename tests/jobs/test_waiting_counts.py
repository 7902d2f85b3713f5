"""The waiting-job counters the submission caps read (issue #32, migration 0014waiting).

Triggers on ``job`` keep ``waiting_count`` in each writer's transaction. After every kind of
change a writer makes (a submission, an array's tasks in one statement, each step of the
state machine, a cancel, a row moved to another account or user, a deletion, a rolled-back
transaction) the counters must equal a COUNT of the waiting jobs. A drift here would let an
account past its cap or refuse it below it, which is what the last test shows a user.
"""

from __future__ import annotations

from sqlalchemy import func, select, update

from gateway.domain.states import JobState
from gateway.jobs.caps import WAITING_STATES
from gateway.jobs.service import set_state
from gateway.kit.db import transaction
from gateway.models.jobs import Job, WaitingCount

JOB = {"name": "w", "account": "team-a", "command": ["true"], "workers": 1}


def _counted(gw) -> dict[tuple[str, str], int]:
    """The counters, rows at zero left out (a counter row stays once made)."""
    with gw.session() as s:
        return {(a, u): n for a, u, n in s.execute(select(WaitingCount.account_name, WaitingCount.username,
                                                          WaitingCount.n)) if n}


def _truth(gw) -> dict[tuple[str, str], int]:
    with gw.session() as s:
        return {(a, u): n for a, u, n in s.execute(
            select(Job.account_name, Job.username, func.count()).where(Job.state.in_(WAITING_STATES))
            .group_by(Job.account_name, Job.username))}


def _agree(gw) -> dict[tuple[str, str], int]:
    truth = _truth(gw)
    assert _counted(gw) == truth
    return truth


def _submit(gw, user="alice", account="team-a", **extra):
    r = gw.client.post("/v1/jobs", json={**JOB, "account": account, **extra},
                       headers=gw.headers(user=user, groups=(account,)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_counters_follow_every_writer(gw):
    ids = [_submit(gw) for _ in range(3)] + [_submit(gw, user="bob", account="team-b")]
    assert _agree(gw) == {("team-a", "alice"): 3, ("team-b", "bob"): 1}

    # An array: its tasks are written in one statement.
    r = gw.client.post("/v1/job-sets", json={**JOB, "array": {"count": 50, "max_running": 2}},
                       headers=gw.headers())
    assert r.status_code == 202, r.text
    set_id = r.json()["id"]
    assert _agree(gw)[("team-a", "alice")] == 53

    # Every step of a job's life, each in its own transaction.
    path = [JobState.DISPATCHING, JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.REQUEUED,
            JobState.PENDING, JobState.DISPATCHING, JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED]
    for state in path:
        with transaction(gw.app.state.sessionmaker) as s:
            set_state(s, s.get(Job, ids[0]), state, actor="test")
        _agree(gw)
    assert _counted(gw)[("team-a", "alice")] == 52

    # Cancels through the API: one job, then the whole array.
    assert gw.client.post(f"/v1/jobs/{ids[1]}/cancel", headers=gw.headers()).status_code in (200, 202)
    assert gw.client.post(f"/v1/job-sets/{set_id}/cancel", headers=gw.headers()).status_code == 202
    assert _agree(gw)[("team-a", "alice")] == 1

    # A row moved to another account and user while waiting, then one deleted.
    with transaction(gw.app.state.sessionmaker) as s:
        s.execute(update(Job).where(Job.id == ids[2]).values(account_name="team-b", username="bob"))
    assert _agree(gw) == {("team-b", "bob"): 2}
    with transaction(gw.app.state.sessionmaker) as s:
        s.delete(s.get(Job, ids[3]))
    assert _agree(gw) == {("team-b", "bob"): 1}

    # A transaction that rolls back leaves the counters as they were.
    s = gw.session()
    try:
        set_state(s, s.get(Job, ids[2]), JobState.CANCELLED, actor="test")
        s.flush()
        s.rollback()
    finally:
        s.close()
    assert _agree(gw) == {("team-b", "bob"): 1}


def test_a_cap_counts_what_the_counters_hold(gw, site):
    """What a user notices: the cap refuses at the limit and frees a place when one starts."""
    site(max_pending_jobs_per_user=2)
    first = _submit(gw)
    _submit(gw)
    r = gw.client.post("/v1/jobs", json=JOB, headers=gw.headers())
    assert r.status_code == 429 and "2 of 2 pending jobs" in r.json()["detail"], r.text
    with transaction(gw.app.state.sessionmaker) as s:
        job = s.get(Job, first)
        for state in (JobState.DISPATCHING, JobState.QUEUED, JobState.RUNNING):
            set_state(s, job, state, actor="test")
    _submit(gw)
    _agree(gw)
