"""Flaky nodes in the simulator (gateway/domain/sim_failures.py, issue #48 item 4): retries avoid
the nodes that failed them, quarantined nodes get no gang until cleared, and without failures
the replay is the plain one."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.domain.nodehealth import Thresholds
from gateway.domain.sim_failures import (
    AVOID,
    NONE,
    QUARANTINE,
    FailureModel,
    simulate_failures,
)
from gateway.domain.sim_inputs import SimPool, TraceJob
from gateway.domain.simulate import simulate

HOUR = 3600.0
SLURM = [SimPool("slurm", "slurm", 4, 8)]
MIXED = [SimPool("slurm", "slurm", 4, 8), SimPool("kube", "kubernetes", 2, 8)]
SHARES = {"team-a": 1, "team-b": 1}
FLAKY = (("slurm", "n000"),)


def model(policy: str, **kw) -> FailureModel:
    """n000 fails any gang on it within minutes; healthy nodes never fail."""
    kw = {"flaky_nodes": FLAKY, "flaky_mttf_s": 60.0, "healthy_mttf_s": None, "checkpoint_every_s": None} | kw
    return FailureModel(policy=policy, **kw)


def job(jid: str, at: float, account: str = "team-a", workers: int = 1, run_s: float = 2 * HOUR) -> TraceJob:
    return TraceJob(jid, at, account, workers, 8, run_s, run_s * 2, kinds=("slurm",))


def stream(n: int = 12, every: float = 1200.0) -> list[TraceJob]:
    """1-node jobs of two accounts in turn, one every ``every`` s."""
    return [job(f"j{i}", i * every, ("team-a", "team-b")[i % 2]) for i in range(n)]


def outcome(res, jid):
    return next(o for o in res.outcomes if o.job.id == jid)


def signature(res):
    return ([(o.job.id, o.pool, o.start, o.end, o.attempts, o.failures) for o in res.outcomes],
            res.utilisation, res.busy_gpu_seconds, res.rounds)


def test_without_flaky_nodes_every_policy_is_the_plain_replay():
    trace = stream() + [job("gang", 100.0, "team-b", workers=3), TraceJob("k", 50.0, "team-a", 1, 4, HOUR, HOUR)]
    trace.sort(key=lambda j: (j.arrival, j.id))
    plain = signature(simulate(trace, MIXED, SHARES))
    for policy in (NONE, AVOID, QUARANTINE):
        res = simulate_failures(trace, MIXED, SHARES, FailureModel(policy=policy, flaky_per_pool=0,
                                                                    healthy_mttf_s=None))
        assert signature(res) == plain
        assert res.failed_attempts == 0 and res.failed_gpu_hours == 0 and not res.quarantine_log
        assert len(res.attempt_log) == sum(1 for o in res.outcomes if o.pool == "slurm")  # its nodes named


def test_the_model_is_deterministic_and_seeded():
    trace = stream()
    m = FailureModel(policy=QUARANTINE, seed=3, flaky_per_pool=1, flaky_mttf_s=HOUR, healthy_mttf_s=20 * HOUR)
    a, b = simulate_failures(trace, SLURM, SHARES, m), simulate_failures(trace, SLURM, SHARES, m)
    assert signature(a) == signature(b) and a.attempt_log == b.attempt_log and a.flaky_nodes == b.flaky_nodes
    assert len(a.flaky_nodes) == 1


def test_without_avoidance_a_retry_lands_on_the_flaky_node_until_the_rule_gives_up():
    res = simulate_failures([job("a", 0.0)], SLURM, SHARES, model(NONE))
    o = outcome(res, "a")
    assert [e[2] for e in res.attempt_log] == [("n000",)] * 3
    assert o.failures == o.flaky_failures == 3 and o.gave_up  # max_attempts 3, the gateway's default


def returns(res, m) -> tuple[int, int]:
    """(retries started within avoid_s on the node whose failure ended the job's attempt, on a
    node of that failed gang that did not fail)."""
    failed = {(jid, at): node for jid, _, node, at in res.failure_log}
    on_failed = on_mate = 0
    for jid, _, nodes, _, end, outcome_ in res.attempt_log:
        if outcome_ != "node_failure":
            continue
        node = failed[(jid, end)]
        later = [e for e in res.attempt_log if e[0] == jid and end <= e[3] <= end + m.thresholds.avoid_s]
        on_failed += sum(1 for e in later if node in e[2])
        on_mate += sum(1 for e in later if set(e[2]) & (set(nodes) - {node}))
    return on_failed, on_mate


def test_with_avoidance_a_retry_never_lands_on_the_node_that_failed_it_within_avoid_s():
    m = model(AVOID, flaky_mttf_s=600.0, healthy_mttf_s=4 * HOUR, seed=5)
    trace = stream(n=16, every=900.0) + [job(f"gang{i}", 1000.0 + i * 3000, "team-b", workers=3) for i in range(4)]
    trace.sort(key=lambda j: (j.arrival, j.id))
    res = simulate_failures(trace, SLURM, SHARES, dataclasses.replace(m, policy=NONE))
    assert returns(res, m)[0] > 0  # without avoidance the retry does land on it
    res = simulate_failures(trace, SLURM, SHARES, m)
    assert res.failed_attempts > 0 and len(res.failure_log) == res.failed_attempts
    on_failed, on_mate = returns(res, m)
    assert on_failed == 0
    assert on_mate > 0  # only the failed node is blamed: its gang-mates stay usable for the retry
    assert all(o.end is not None for o in res.outcomes)
    # The backend naming no node: the whole failed gang is avoided, as before.
    gang = simulate_failures(trace, SLURM, SHARES, dataclasses.replace(m, blame_gang=True))
    assert gang.failed_attempts > 0 and returns(gang, m) == (0, 0)


def test_avoidance_holds_a_retry_that_only_its_failed_node_would_fit():
    # A 4-node gang fails on the 4-node pool; its retry avoids all 4 nodes for avoid_s: it waits.
    m = model(AVOID, thresholds=Thresholds(avoid_s=2 * HOUR), max_attempts=5)
    res = simulate_failures([job("g", 0.0, workers=4)], SLURM, SHARES, m)
    starts = [e[3] for e in res.attempt_log]
    assert len(starts) >= 2 and starts[1] >= res.attempt_log[0][4] + 2 * HOUR


def test_quarantine_takes_a_node_out_of_placement_and_capacity_until_cleared():
    m = model(QUARANTINE, clear_after_s=6 * HOUR)
    # a fails on n000 and its retry avoids it; b, of another account, lands on it next and fails too
    trace = [job("a", 0.0, "team-a"), job("b", 600.0, "team-b"), job("gang", 1800.0, "team-a", workers=4)]
    res = simulate_failures(trace, SLURM, SHARES, m)
    assert [(q[0], q[1]) for q in res.quarantine_log] == [("slurm", "n000")]
    _, _, since, until, flaky = res.quarantine_log[0]
    assert until == since + 6 * HOUR and flaky
    for jid, _, nodes, start, _, _ in res.attempt_log:
        assert not ("n000" in nodes and since <= start < until), (jid, start)
    # the 4-node gang needs the whole pool: it waits for the clear (then n000 fails it again)
    assert outcome(res, "gang").start >= until
    plain = simulate_failures(trace, SLURM, SHARES, dataclasses.replace(m, policy=AVOID))
    assert outcome(plain, "gang").start < until


def test_one_accounts_failures_quarantine_nothing():
    m = model(QUARANTINE)
    trace = [job("a", 0.0), job("b", 600.0)]  # both team-a: a broken job's failures are not the node's
    res = simulate_failures(trace, SLURM, SHARES, m)
    assert res.failed_attempts >= 2 and not res.quarantine_log


def test_quarantine_loses_no_more_than_avoidance_or_nothing_on_a_stream_through_a_flaky_node():
    trace = stream(n=24, every=1200.0)
    lost = {p: simulate_failures(trace, SLURM, SHARES, model(p, flaky_mttf_s=1800.0, clear_after_s=24 * HOUR))
            for p in (NONE, AVOID, QUARANTINE)}
    assert lost[QUARANTINE].failed_gpu_hours < lost[AVOID].failed_gpu_hours
    assert lost[QUARANTINE].failed_gpu_hours < lost[NONE].failed_gpu_hours
    assert lost[QUARANTINE].failed_attempts < lost[NONE].failed_attempts


def test_repair_on_clear_mends_the_flaky_node():
    trace = [job("a", 0.0, "team-a"), job("b", 600.0, "team-b"), job("c", 9 * HOUR, "team-a", workers=4)]
    m = model(QUARANTINE, clear_after_s=4 * HOUR, repair_on_clear=True)
    res = simulate_failures(trace, SLURM, SHARES, m)
    assert outcome(res, "c").failures == 0 and outcome(res, "c").end is not None
    kept = simulate_failures(trace, SLURM, SHARES, dataclasses.replace(m, repair_on_clear=False))
    assert outcome(kept, "c").failures > 0


def test_a_checkpoint_keeps_the_work_before_it():
    trace = [job("a", 0.0, run_s=10 * HOUR)]
    m = FailureModel(policy=NONE, flaky_nodes=FLAKY, flaky_mttf_s=3 * HOUR, healthy_mttf_s=None,
                     checkpoint_every_s=1800.0, max_attempts=10)
    res = simulate_failures(trace, SLURM, SHARES, m)
    o = outcome(res, "a")
    ran = sum(e[4] - e[3] for e in res.attempt_log)
    assert o.failures > 0 and o.end is not None
    assert o.failed_gpu_s == pytest.approx(8 * (ran - 10 * HOUR))  # what it ran beyond its work was lost
    assert o.failed_gpu_s <= o.failures * 8 * 1800.0


def test_unsupported_combinations_are_refused():
    with pytest.raises(ValueError):
        FailureModel(policy="sometimes")
    with pytest.raises(ValueError):
        simulate_failures(stream(2), [SimPool("s", "slurm", 4, 8, blocks=(2, 2))], SHARES, model(NONE))
    with pytest.raises(ValueError):
        simulate_failures(stream(2), SLURM, SHARES, model(NONE), policy="borrow", guarantees={"team-a": 8})


def test_a_quarantine_blames_the_failed_node_not_its_gang_mates():
    # a (2 nodes: n000 n001) fails on n000; b, of another account, arrives when its retry runs.
    # Blaming the failed node, a's retry avoids n000 only (n001 n002) and b gets n000 n003: n000
    # alone failed two accounts' gangs. Blaming the gang, a's retry avoids n000 and n001
    # (n002 n003), b gets n000 n001 and fails: healthy n001 is quarantined with n000.
    trace = [job("a", 0.0, "team-a", workers=2), job("b", 600.0, "team-b", workers=2)]
    m = model(QUARANTINE)
    res = simulate_failures(trace, SLURM, SHARES, m)
    assert [(q[0], q[1], q[4]) for q in res.quarantine_log] == [("slurm", "n000", True)]
    assert {n for _, _, n, _ in res.failure_log} == {"n000"}
    gang = simulate_failures(trace, SLURM, SHARES, dataclasses.replace(m, blame_gang=True))
    assert sorted((q[1], q[4]) for q in gang.quarantine_log) == [("n000", True), ("n001", False)]
    assert {n for _, _, n, _ in gang.failure_log} == {"n000"}  # n001 never failed


def test_blaming_the_failed_node_never_quarantines_a_node_that_did_not_fail():
    # Two flaky nodes, healthy nodes failing too, gangs of 1-4 nodes of two accounts: every
    # quarantine is of a node whose own failures ended two accounts' attempts between its last
    # clear and it.
    trace = [job(f"j{i}", i * 700.0, ("team-a", "team-b")[i % 2], workers=1 + i % 4 if i % 3 else 1)
             for i in range(60)]
    m = model(QUARANTINE, flaky_nodes=(("slurm", "n000"), ("slurm", "n002")), flaky_mttf_s=1800.0,
              healthy_mttf_s=6 * HOUR, clear_after_s=2 * HOUR, max_attempts=5, seed=7)
    account = {j.id: j.account for j in trace}
    for blame_gang in (False, True):
        res = simulate_failures(trace, SLURM, SHARES, dataclasses.replace(m, blame_gang=blame_gang))
        assert res.quarantine_log
        wrong, cleared = 0, {}
        for pool, node, since, until, _ in sorted(res.quarantine_log, key=lambda q: q[2]):
            after = cleared.get((pool, node), -1.0)
            failed = {account[jid] for jid, p, n, at in res.failure_log
                      if (p, n) == (pool, node) and after < at <= since}
            wrong += len(failed) < m.thresholds.min_accounts
            cleared[(pool, node)] = until
        assert (wrong == 0) is not blame_gang  # blaming the gang, some quarantined node had not failed
