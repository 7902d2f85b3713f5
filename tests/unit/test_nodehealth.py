"""The node-health rule (gateway/domain/nodehealth.py; issue #48, item 3): pure, no database."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from gateway.domain.nodehealth import (
    AttemptEnd,
    Thresholds,
    avoided,
    outcome_of,
    verdicts,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
H = 3600


def end(account: str, *nodes: str, ago_s: float = 60, outcome: str = "node_failure", pool: str = "slurm-a",
        gpu_s: int = 0, job: str = "j") -> AttemptEnd:
    return AttemptEnd(job_id=job, account=account, pool=pool, nodes=nodes, ended_at=NOW - timedelta(seconds=ago_s),
                      outcome=outcome, charged_gpu_seconds=gpu_s)


def test_one_accounts_failures_do_not_make_a_node_suspect():
    v = verdicts([end("team-a", "n1", ago_s=600), end("team-a", "n1", ago_s=60)], now=NOW)[("slurm-a", "n1")]
    assert not v.suspect and v.failures == 2 and v.accounts == ("team-a",)
    assert "of one account" in v.reason


def test_two_accounts_failed_on_one_node_within_the_window_make_it_suspect():
    out = verdicts([end("team-a", "n1", "n2", ago_s=1800), end("team-b", "n1", ago_s=60)], now=NOW)
    v = out[("slurm-a", "n1")]
    assert v.suspect and v.accounts == ("team-a", "team-b") and v.failures == 2
    assert v.reason.startswith("2 infrastructure failures ended jobs of 2 accounts (team-a, team-b) within 29 min")
    assert "until an admin clears it" in v.reason
    assert not out[("slurm-a", "n2")].suspect  # only one account's job failed there


def test_failures_further_apart_than_the_window_do_not_add_up():
    out = verdicts([end("team-a", "n1", ago_s=3 * H), end("team-b", "n1", ago_s=60)], now=NOW,
                   thresholds=Thresholds(window_s=H))
    assert not out[("slurm-a", "n1")].suspect


def test_a_suspect_node_stays_quarantined_until_cleared_or_quiet():
    ends = [end("team-a", "n1", ago_s=30 * H), end("team-b", "n1", ago_s=30 * H - 60)]
    assert verdicts(ends, now=NOW)[("slurm-a", "n1")].suspect  # no quiet time set: until an admin clears it
    quiet = verdicts(ends, now=NOW, thresholds=Thresholds(quiet_s=24 * H))[("slurm-a", "n1")]
    assert not quiet.suspect and "cleared itself" in quiet.reason
    cleared = verdicts(ends, now=NOW, cleared={("slurm-a", "n1"): NOW - timedelta(hours=1)})[("slurm-a", "n1")]
    assert not cleared.suspect and cleared.failures == 0


def test_failures_after_an_admin_cleared_the_node_count_again():
    ends = [end("team-a", "n1", ago_s=5 * H), end("team-b", "n1", ago_s=5 * H - 60),
            end("team-c", "n1", ago_s=120), end("team-a", "n1", ago_s=60)]
    v = verdicts(ends, now=NOW, cleared={("slurm-a", "n1"): NOW - timedelta(hours=1)})[("slurm-a", "n1")]
    assert v.suspect and v.accounts == ("team-a", "team-c")


@pytest.mark.parametrize("outcome", ["preempted", "exit_code", "time_limit", "succeeded", "cancelled"])
def test_only_infrastructure_failures_count(outcome):
    v = verdicts([end("team-a", "n1", outcome=outcome), end("team-b", "n1", outcome=outcome)], now=NOW)
    assert not v[("slurm-a", "n1")].suspect and v[("slurm-a", "n1")].failures == 0


def test_nodes_of_the_same_name_in_two_pools_are_two_nodes():
    out = verdicts([end("team-a", "n1", pool="slurm-a"), end("team-b", "n1", pool="slurm-b")], now=NOW)
    assert not out[("slurm-a", "n1")].suspect and not out[("slurm-b", "n1")].suspect


def test_a_node_its_backend_has_down_is_suspect_with_the_backends_reason():
    out = verdicts([], now=NOW, backend_down={("slurm-a", "n3"): "DRAIN: ECC errors"})
    assert out[("slurm-a", "n3")].suspect and out[("slurm-a", "n3")].reason.endswith("DRAIN: ECC errors")


def test_what_a_failure_cost_is_shared_over_the_nodes_of_the_attempt():
    out = verdicts([end("team-a", "n1", "n2", gpu_s=7200), end("team-b", "n1", gpu_s=3600),
                    end("team-c", "n2", outcome="exit_code", gpu_s=99999)], now=NOW)
    assert out[("slurm-a", "n1")].lost_gpu_seconds == 3600 + 3600
    assert out[("slurm-a", "n2")].lost_gpu_seconds == 3600  # its job's own exit cost nothing of the node's


def test_a_retry_avoids_the_nodes_that_failed_its_job_for_a_while():
    ends = [end("team-a", "n1", "n2", ago_s=60), end("team-a", "n3", ago_s=60, outcome="preempted"),
            end("team-a", "n4", ago_s=7 * H)]
    assert avoided(ends, now=NOW) == {("slurm-a", "n1"), ("slurm-a", "n2")}
    assert avoided(ends, now=NOW, thresholds=Thresholds(avoid_s=8 * H)) == {
        ("slurm-a", "n1"), ("slurm-a", "n2"), ("slurm-a", "n4")}


@pytest.mark.parametrize("bad", [dict(window_s=0), dict(min_accounts=0), dict(avoid_s=-1), dict(quiet_s=0)])
def test_thresholds_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        Thresholds(**bad)


# --- blame, lasting quarantine, the record's words (issue #48, wired) ---------------------


def test_a_failure_is_blamed_on_the_node_its_backend_had_down_not_on_the_whole_gang():
    a = dataclasses.replace(end("team-a", "n1", "n2", "n3", gpu_s=3600), failed_nodes=("n2",))
    b = dataclasses.replace(end("team-b", "n1", "n2", gpu_s=7200), failed_nodes=("n2",))
    out = verdicts([a, b], now=NOW)
    assert out[("slurm-a", "n2")].suspect and out[("slurm-a", "n2")].lost_gpu_seconds == 10800
    assert not out[("slurm-a", "n1")].suspect and out[("slurm-a", "n1")].lost_gpu_seconds == 0
    assert avoided([a], now=NOW) == {("slurm-a", "n2")}
    # A named node that was not in the gang is ignored: then the whole gang shares the blame.
    c = dataclasses.replace(end("team-a", "n1", "n3"), failed_nodes=("n9",))
    assert c.blamed == ("n1", "n3")


def test_a_quarantine_outlives_the_failures_read_until_an_admin_clears_it_after_it():
    since = NOW - timedelta(days=40)
    key = ("slurm-a", "n1")
    v = verdicts([], now=NOW, suspected={key: since})[key]
    assert v.suspect and "until an admin clears it" in v.reason and not v.by_backend
    assert not verdicts([], now=NOW, suspected={key: since}, cleared={key: since + timedelta(hours=1)})[key].suspect
    # With a quiet time, it clears itself that long after the quarantine began without a failure.
    quiet = Thresholds(quiet_s=7 * 86400)
    assert not verdicts([], now=NOW, suspected={key: since}, thresholds=quiet)[key].suspect
    assert verdicts([], now=NOW, suspected={key: NOW - timedelta(days=1)}, thresholds=quiet)[key].suspect


def test_a_backend_verdict_is_marked_as_the_backends_and_failures_come_first():
    key = ("slurm-a", "n1")
    v = verdicts([], now=NOW, backend_down={key: "DOWN (bad gpu)"})[key]
    assert v.suspect and v.by_backend and "DOWN (bad gpu)" in v.reason
    both = verdicts([end("team-a", "n1"), end("team-b", "n1")], now=NOW, backend_down={key: "DOWN"})[key]
    assert both.suspect and not both.by_backend


@pytest.mark.parametrize(("state", "failure", "code", "seen", "word"), [
    ("succeeded", "", 0, True, "succeeded"), ("cancelled", "", None, True, "cancelled"),
    ("failed", "node_failure", 1, True, "node_failure"), ("failed", "time_limit", None, True, "time_limit"),
    ("failed", "", 3, True, "exit_code"), ("failed", "", None, False, "lost"), ("failed", "", None, True, "failed")])
def test_how_a_last_attempt_ended_in_the_records_words(state, failure, code, seen, word):
    assert outcome_of(state, failure=failure, exit_code=code, seen=seen) == word
