"""A job its backend holds for an unknown user fails after a bound (#14 item 5): the pure decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from adapters.slurm.job_record import job_status
from gateway.domain.states import JobState
from gateway.domain.status import Seen, held_since, hold_failure_reason, hold_verdict

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ago(s: float) -> datetime:
    return NOW - timedelta(seconds=s)


@pytest.mark.parametrize("reason", ["BeginTime", "InvalidAccount", "InvalidQOS"])
def test_slurm_reasons_only_an_admin_can_fix_are_holds(reason):
    st = job_status({"job_id": 7, "job_state": "PENDING", "state_reason": reason, "account": "team-a"})
    assert st.held == reason
    assert f"(Slurm reason {reason})" in st.reason  # in the user's words, naming Slurm's


@pytest.mark.parametrize("record", [
    {"job_state": "PENDING", "state_reason": "Resources"},
    {"job_state": "PENDING", "state_reason": "Priority"},
    {"job_state": "PENDING", "state_reason": "AssocGrpGRES"},  # frees up when the account's other jobs end
    {"job_state": "PENDING", "state_reason": "None"},
    {"job_state": "RUNNING", "state_reason": "BeginTime"},
    {"job_state": "CANCELLED", "state_reason": "InvalidAccount"},
])
def test_waiting_for_resources_or_limits_is_not_a_hold(record):
    assert job_status({"job_id": 7, **record}).held == ""


def test_the_hold_begins_at_the_first_held_event_of_the_current_wait():
    history = [Seen(ago(900), True), Seen(ago(800), True, "BeginTime"),  # an earlier wait
               Seen(ago(700), True),  # it ran: a new wait begins later
               Seen(ago(600), True), Seen(ago(500), False), Seen(ago(400), False, "BeginTime"),
               Seen(ago(300), False), Seen(ago(200), False, "BeginTime")]  # retries flip the reason
    assert held_since(history) == ago(400)


def test_a_state_event_that_records_the_hold_starts_it():
    assert held_since([Seen(ago(50), True), Seen(ago(30), True, "InvalidAccount")]) == ago(30)


def test_no_hold_recorded_in_the_current_wait_is_none():
    assert held_since([]) is None
    assert held_since([Seen(ago(90), True, "BeginTime"), Seen(ago(60), True), Seen(ago(30), False)]) is None


def test_naive_event_times_are_utc():  # SQLite gives them back without a zone
    assert held_since([Seen(ago(30).replace(tzinfo=None), False, "BeginTime")]) == ago(30)


@pytest.mark.parametrize("held_for, verdict", [(0, "wait"), (599, "wait"), (600, "fail"), (3600, "fail")])
def test_a_held_job_fails_once_held_for_the_bound(held_for, verdict):
    assert hold_verdict(state=JobState.QUEUED, held="BeginTime", since=ago(held_for), now=NOW,
                        bound_s=600) == verdict


@pytest.mark.parametrize("state", [JobState.DISPATCHING, JobState.QUEUED, JobState.REQUEUED, JobState.STARTING])
def test_every_waiting_state_can_be_failed(state):
    assert hold_verdict(state=state, held="InvalidAccount", since=ago(10), now=NOW, bound_s=5) == "fail"


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.CANCELLING, JobState.FAILED, JobState.CANCELLED])
def test_running_cancelling_or_ended_jobs_are_left_alone(state):
    assert hold_verdict(state=state, held="BeginTime", since=ago(10_000), now=NOW, bound_s=5) == "none"


def test_not_held_is_none_however_long_it_waits():
    assert hold_verdict(state=JobState.QUEUED, held="", since=ago(10_000), now=NOW, bound_s=5) == "none"


def test_bound_zero_waits_forever_and_an_unrecorded_hold_waits():
    assert hold_verdict(state=JobState.QUEUED, held="BeginTime", since=ago(10_000), now=NOW, bound_s=0) == "wait"
    assert hold_verdict(state=JobState.QUEUED, held="BeginTime", since=None, now=NOW, bound_s=5) == "wait"


def test_the_failure_keeps_the_users_words_and_says_what_the_gateway_did():
    words = ("Slurm could not start the job as the job's user and retries it later (Slurm reason BeginTime); "
             "usually the user has no POSIX account on the cluster's nodes")
    assert hold_failure_reason(words, pool="slurm", held_s=612.7, bound_s=600) == (
        f"{words}. The gateway gave up after the job was held 612 s (ISTHMUS_HELD_JOB_FAIL_AFTER_S=600) "
        f"and cancelled it on slurm")


def test_the_setting_has_a_documented_default():
    from gateway.kit.settings import Settings

    assert Settings.model_fields["held_job_fail_after_s"].default == 600.0
