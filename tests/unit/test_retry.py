"""The retry rule (gateway/domain/retry.py): which failed attempts run again."""

from gateway.domain.retry import (
    EXIT_CODE,
    NODE_FAILURE,
    PREEMPTED,
    RetryPolicy,
    policy_of,
    verdict,
)


def test_the_site_default_retries_node_failures_only_up_to_its_attempts():
    policy = policy_of({}, 3)
    assert policy == RetryPolicy(max_attempts=3)
    assert verdict(policy, attempt=1, failure=NODE_FAILURE, exit_code=None) == NODE_FAILURE
    assert verdict(policy, attempt=2, failure=NODE_FAILURE, exit_code=1) == NODE_FAILURE
    assert verdict(policy, attempt=3, failure=NODE_FAILURE, exit_code=None) is None  # the last one
    assert verdict(policy, attempt=1, failure="", exit_code=1) is None  # the job's own exit
    assert verdict(policy, attempt=1, failure="", exit_code=None) is None  # e.g. a time limit


def test_a_job_asks_for_its_own_exit_codes_and_can_turn_retries_off():
    policy = policy_of({"retry": {"max_attempts": 4, "on": ["exit_code"], "exit_codes": [3, 75]}}, 3)
    assert verdict(policy, attempt=1, failure="", exit_code=75) == EXIT_CODE
    assert verdict(policy, attempt=3, failure="", exit_code=3) == EXIT_CODE
    assert verdict(policy, attempt=4, failure="", exit_code=3) is None
    assert verdict(policy, attempt=1, failure="", exit_code=1) is None
    assert verdict(policy, attempt=1, failure=NODE_FAILURE, exit_code=None) is None  # not asked for
    any_code = policy_of({"retry": {"max_attempts": 2, "on": ["exit_code", "node_failure"]}}, 3)
    assert verdict(any_code, attempt=1, failure="", exit_code=1) == EXIT_CODE
    assert verdict(any_code, attempt=1, failure="", exit_code=0) is None
    assert verdict(any_code, attempt=1, failure=NODE_FAILURE, exit_code=None) == NODE_FAILURE
    off = policy_of({"retry": {"max_attempts": 1}}, 3)
    assert verdict(off, attempt=1, failure=NODE_FAILURE, exit_code=None) is None
    assert off.words() == "up to 1 attempts on node failure or preempted"


def test_a_preemption_is_retried_whenever_asked_and_never_counted():
    default = policy_of({}, 3)
    assert verdict(default, attempt=3, failure=PREEMPTED, exit_code=None) == PREEMPTED  # not counted
    assert verdict(default, attempt=1, failure=PREEMPTED, exit_code=143) == PREEMPTED
    once = policy_of({"retry": {"max_attempts": 1}}, 3)  # no failure retried, preemptions still
    assert verdict(once, attempt=1, failure=PREEMPTED, exit_code=None) == PREEMPTED
    never = policy_of({"retry": {"max_attempts": 3, "on": ["node_failure"]}}, 3)
    assert verdict(never, attempt=1, failure=PREEMPTED, exit_code=None) is None
