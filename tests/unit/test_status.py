"""What a backend status means for a registry job: the pure functions, no database, no cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from adapters.base import BackendState, JobStatus
from gateway.domain.states import JobState
from gateway.domain.status import BACKEND_TO_JOB, absence, meaning, step

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STARTED = NOW - timedelta(minutes=10)


def status(state: BackendState, *, job_id: str = "42", reason: str = "", raw: str = "", requeued_at=None,
           ended_at=None, exit_code=None):
    return JobStatus(backend_job_id=job_id, gateway_job_id="j-1", state=state, reason=reason, raw_state=raw,
                     requeued_at=requeued_at, ended_at=ended_at, exit_code=exit_code)


def test_every_backend_state_has_a_registry_state():
    assert set(BACKEND_TO_JOB) == set(BackendState)


def test_the_reason_is_the_backends_words_else_its_raw_state_else_the_state():
    assert meaning(state=JobState.QUEUED, started_at=None, backend_job_id="42",
                   status=status(BackendState.QUEUED, reason="Resources", raw="PENDING"), now=NOW).reason == "Resources"
    assert meaning(state=JobState.QUEUED, started_at=None, backend_job_id="42",
                   status=status(BackendState.QUEUED, raw="PENDING"), now=NOW).reason == "PENDING"
    assert meaning(state=JobState.QUEUED, started_at=None, backend_job_id="42",
                   status=status(BackendState.QUEUED), now=NOW).reason == "queued"


def test_another_backend_job_than_the_recorded_one_says_nothing():
    m = meaning(state=JobState.RUNNING, started_at=STARTED, backend_job_id="42",
                status=status(BackendState.FAILED, job_id="43"), now=NOW)
    assert m.foreign and m.requeued_at is None


def test_before_the_submission_is_recorded_any_matched_job_counts():
    m = meaning(state=JobState.DISPATCHING, started_at=None, backend_job_id=None,
                status=status(BackendState.QUEUED, job_id="43"), now=NOW)
    assert not m.foreign and m.target is JobState.QUEUED


@pytest.mark.parametrize("backend", [BackendState.QUEUED, BackendState.RUNNING, BackendState.REQUEUED])
def test_a_cancelling_job_waits_until_the_backend_ends_it(backend):
    assert meaning(state=JobState.CANCELLING, started_at=STARTED, backend_job_id="42", status=status(backend),
                   now=NOW).awaiting_cancel


def test_a_cancelling_job_the_backend_ended_is_finished():
    m = meaning(state=JobState.CANCELLING, started_at=STARTED, backend_job_id="42",
                status=status(BackendState.CANCELLED), now=NOW)
    assert not m.awaiting_cancel and step(JobState.CANCELLING, m.target) == "finish"


@pytest.mark.parametrize("backend", [BackendState.SUCCEEDED, BackendState.FAILED])
@pytest.mark.parametrize("ended", [NOW - timedelta(seconds=30), None])
def test_a_job_that_ended_on_its_own_after_a_cancel_was_accepted_is_cancelled(backend, ended):
    """The cancel could not reach the backend at once (pool cut off, claim's worker dead)."""
    m = meaning(state=JobState.CANCELLING, started_at=STARTED, backend_job_id="42",
                status=status(backend, reason="Completed", ended_at=ended, exit_code=0), now=NOW,
                cancel_requested_at=NOW - timedelta(minutes=1))
    assert m.target is JobState.CANCELLED and step(JobState.CANCELLING, m.target) == "finish"
    assert m.reason == (f"cancelled; the backend ended it first ({BACKEND_TO_JOB[backend].value}, exit code 0: "
                        "Completed) before the cancel could reach it")


def test_a_job_that_ended_before_the_cancel_was_asked_keeps_its_ending():
    m = meaning(state=JobState.CANCELLING, started_at=STARTED, backend_job_id="42",
                status=status(BackendState.SUCCEEDED, ended_at=NOW - timedelta(minutes=2)), now=NOW,
                cancel_requested_at=NOW - timedelta(minutes=1))
    assert m.target is JobState.SUCCEEDED


def test_a_running_job_reported_queued_was_requeued_now():
    m = meaning(state=JobState.RUNNING, started_at=STARTED, backend_job_id="42",
                status=status(BackendState.QUEUED, reason="BeginTime"), now=NOW)
    assert m.requeued_at == NOW and m.requeue_reason == "BeginTime" and not m.after_requeue


def test_a_requeue_between_two_looks_is_seen_in_a_running_status():
    at = NOW - timedelta(minutes=2)
    m = meaning(state=JobState.RUNNING, started_at=STARTED, backend_job_id="42",
                status=status(BackendState.RUNNING, requeued_at=at), now=NOW)
    assert m.requeued_at == at and m.after_requeue
    assert m.requeue_reason.startswith(f"requeued at {at.isoformat()} and running again")


def test_an_older_requeue_than_the_recorded_run_is_not_a_new_one():
    m = meaning(state=JobState.RUNNING, started_at=STARTED, backend_job_id="42",
                status=status(BackendState.RUNNING, requeued_at=STARTED - timedelta(hours=1)), now=NOW)
    assert m.requeued_at is None


def test_only_a_running_job_can_be_requeued():
    m = meaning(state=JobState.QUEUED, started_at=None, backend_job_id="42",
                status=status(BackendState.QUEUED, requeued_at=NOW), now=NOW)
    assert m.requeued_at is None


@pytest.mark.parametrize(("state", "target", "expected"), [
    (JobState.QUEUED, JobState.RUNNING, "move"),
    (JobState.QUEUED, JobState.QUEUED, "note"),
    (JobState.RUNNING, JobState.STARTING, "note"),  # one worker ended before its peers: the gang has run
    (JobState.RUNNING, JobState.SUCCEEDED, "finish"),
    (JobState.DISPATCHING, JobState.FAILED, "finish"),
    (JobState.REQUEUED, JobState.RUNNING, "move"),
])
def test_step(state, target, expected):
    assert step(state, target) == expected


@pytest.mark.parametrize(("state", "expected"), [
    (JobState.CANCELLING, "cancelled"),
    (JobState.DISPATCHING, "wait"),
    (JobState.QUEUED, "count_miss"),
    (JobState.RUNNING, "count_miss"),
])
def test_absence(state, expected):
    assert absence(state) == expected
