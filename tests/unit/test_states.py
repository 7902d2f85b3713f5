"""The transition table (gateway/domain/states.py): which state changes a job may make."""

from __future__ import annotations

import itertools

import pytest

from gateway.domain.states import (
    FINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    can_transition,
    check_transition,
)

S = JobState


def test_final_states_have_no_exit():
    for s in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert TRANSITIONS[s] == frozenset()
    assert set(TRANSITIONS) == set(JobState)


def test_final_is_exactly_the_states_with_no_exit():
    assert FINAL_STATES == {s for s in S if not TRANSITIONS[s]} == {s for s in S if s.final}


@pytest.mark.parametrize("path", [
    [S.PENDING, S.DISPATCHING, S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED],
    [S.BLOCKED, S.PENDING, S.DISPATCHING, S.PENDING],  # a submission that failed is retried
    [S.RUNNING, S.REQUEUED, S.QUEUED, S.RUNNING, S.CANCELLING, S.CANCELLED],
    [S.BLOCKED, S.CANCELLED],  # a dependency that can no longer be met
])
def test_the_documented_paths_are_legal(path):
    for current, target in itertools.pairwise(path):
        check_transition(current, target)
        assert can_transition(current, target)


@pytest.mark.parametrize(("current", "target"), [
    (S.BLOCKED, S.DISPATCHING),  # a blocked job is never picked
    (S.PENDING, S.RUNNING),  # nothing runs without being claimed
    (S.PENDING, S.SUCCEEDED),
    (S.CANCELLING, S.RUNNING),  # a cancel asked is never undone
    (S.CANCELLED, S.PENDING),
    (S.SUCCEEDED, S.FAILED),
])
def test_illegal_changes_are_refused_naming_both_states(current, target):
    assert not can_transition(current, target)
    with pytest.raises(IllegalTransition) as info:
        check_transition(current, target)
    assert (info.value.current, info.value.target) == (current, target)
    assert f"{current.value} -> {target.value}" in str(info.value)


def test_a_new_job_starts_pending_or_blocked_only():
    check_transition(None, S.PENDING)
    check_transition(None, S.BLOCKED)
    for target in set(S) - {S.PENDING, S.BLOCKED}:
        with pytest.raises(IllegalTransition):
            check_transition(None, target)


def test_only_a_claimed_job_or_a_failed_attempt_goes_back_to_pending():
    # A claimed job whose submission did not go through; an attempt that failed on its
    # backend and is run again (docs/recovery.md). Never a final job, never one being cancelled.
    assert {s for s in S if S.PENDING in TRANSITIONS[s]} == {
        S.BLOCKED, S.DISPATCHING, S.QUEUED, S.STARTING, S.RUNNING, S.REQUEUED}
