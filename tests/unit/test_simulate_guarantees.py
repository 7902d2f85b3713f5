"""The simulator's guarantee policies (gateway/domain/simulate.py, issue #30): hard caps, and
guarantees + borrowing + reclaim through the one victim rule (gateway/domain/preempt.py)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.domain.sim_inputs import (
    Reclaim,
    SimPool,
    TraceJob,
    within_guarantee,
)
from gateway.domain.simulate import simulate

KUBE = [SimPool("kube", "kubernetes", 4, 8)]  # 32 GPUs
SHARES = {"team-a": 1, "team-b": 1}
HALF = {"team-a": 16, "team-b": 16}
HOUR = 3600.0


def b_jobs(run_s=5 * HOUR, late=500.0):
    """team-b: two 8-GPU jobs within its guarantee, one borrowed at 0 and one borrowed at ``late``."""
    return [TraceJob("b0", 0.0, "team-b", 1, 8, run_s, run_s), TraceJob("b1", 0.0, "team-b", 1, 8, run_s, run_s),
            TraceJob("b2", 0.0, "team-b", 1, 8, run_s, run_s), TraceJob("b3", late, "team-b", 1, 8, run_s, run_s)]


def outcome(res, jid):
    return next(o for o in res.outcomes if o.job.id == jid)


def test_an_idle_accounts_gpus_are_borrowed_and_hard_caps_leave_them_idle():
    trace = b_jobs()
    caps = simulate(trace, KUBE, SHARES, policy="hard-caps", guarantees=HALF)
    borrow = simulate(trace, KUBE, SHARES, policy="borrow", guarantees=HALF)
    assert outcome(caps, "b2").start == 5 * HOUR  # waits for b0 to end: team-b is at its cap
    assert outcome(borrow, "b2").start == 0.0 and outcome(borrow, "b3").start == 500.0
    assert borrow.utilisation > caps.utilisation
    assert borrow.utilisation == borrow.utilisation_in(0.0, 500.0)  # the default window: first to last arrival
    assert caps.utilisation_in(0.0, 500.0) == 0.5  # team-b's 16 GPUs of 32
    assert borrow.evictions == 0  # nobody within a guarantee asked for the room
    # Jain's index without the idle account: team-b alone is perfectly fair to itself.
    assert borrow.jain() == 0.5 and borrow.jain(frozenset({"team-a"})) == 1.0


def test_a_guaranteed_gang_evicts_the_cheapest_borrowed_job_and_starts_after_the_grace_period():
    trace = b_jobs() + [TraceJob("a", 2000.0, "team-a", 1, 8, HOUR, HOUR)]
    res = simulate(trace, KUBE, SHARES, policy="borrow", guarantees=HALF,
                   reclaim=Reclaim(grace_s=120, min_runtime_s=600, checkpoint_every_s=1800))
    # b2 checkpointed at 1800 (200 s at risk), b3 never yet (1500 s at risk): b2 is cheaper.
    assert [(t, victim, gang) for t, _pool, victim, gang, _ in res.eviction_log] == [(2000.0, "b2", "a")]
    assert "team-a's gang (8 GPUs) within its guarantee on kube: stops 1 borrowed job of team-b: b2" in \
        res.eviction_log[0][4]
    assert outcome(res, "a").start == 2120.0
    b2 = outcome(res, "b2")
    assert b2.evictions == 1 and b2.lost_gpu_s == 8 * (2120 - 1800)  # since its checkpoint at 1800
    assert b2.attempts == 2 and b2.start == 0.0
    # It waits again until team-a's job ends, then resumes from its checkpoint: 5 h of work,
    # 1800 s of it kept.
    assert outcome(res, "a").end == 2120.0 + HOUR
    assert b2.end == 2120.0 + HOUR + (5 * HOUR - 1800)
    assert all(outcome(res, j).attempts == 1 for j in ("b0", "b1", "b3"))


def test_without_reports_the_choice_takes_all_run_time_as_at_risk_and_loses_more():
    trace = b_jobs() + [TraceJob("a", 2000.0, "team-a", 1, 8, HOUR, HOUR)]
    res = simulate(trace, KUBE, SHARES, policy="borrow", guarantees=HALF,
                   reclaim=Reclaim(grace_s=120, checkpoint_every_s=1800, reports=False))
    assert [victim for _, _, victim, _, _ in res.eviction_log] == ["b3"]  # 1500 s run against 2000 s
    assert outcome(res, "b3").lost_gpu_s == 8 * (2120 - 500)  # it had not checkpointed yet
    assert res.lost_gpu_hours > 8 * 320 / HOUR


def test_a_job_younger_than_the_minimum_runtime_is_not_chosen():
    trace = b_jobs(late=1500.0) + [TraceJob("a", 2000.0, "team-a", 1, 8, HOUR, HOUR)]
    res = simulate(trace, KUBE, SHARES, policy="borrow", guarantees=HALF,
                   reclaim=Reclaim(min_runtime_s=600, checkpoint_every_s=None))  # b3 is cheapest, but 500 s old
    assert [victim for _, _, victim, _, _ in res.eviction_log] == ["b2"]
    res = simulate(trace, KUBE, SHARES, policy="borrow", guarantees=HALF,
                   reclaim=Reclaim(min_runtime_s=3 * HOUR, checkpoint_every_s=None))
    assert res.evictions == 0 and outcome(res, "a").start == 5 * HOUR  # waits for a job to end


def test_nothing_within_a_guarantee_is_evicted_and_work_beyond_one_reclaims_nothing():
    # team-a asks for 24 GPUs against a guarantee of 16: it may borrow, never reclaim.
    trace = b_jobs() + [TraceJob("a-big", 2000.0, "team-a", 3, 8, HOUR, HOUR)]
    res = simulate(trace, KUBE, SHARES, policy="borrow", guarantees=HALF)
    assert res.evictions == 0
    # Two 8-GPU jobs of team-a within its guarantee stop both borrowed jobs, never b0 or b1.
    trace = b_jobs() + [TraceJob(f"a{i}", 2000.0, "team-a", 1, 8, HOUR, HOUR) for i in range(2)]
    res = simulate(trace, KUBE, SHARES, policy="borrow", guarantees=HALF)
    assert sorted(victim for _, _, victim, _, _ in res.eviction_log) == ["b2", "b3"]
    assert outcome(res, "b0").attempts == outcome(res, "b1").attempts == 1


def test_the_rate_limit_holds_over_a_run():
    # team-b fills the pool with 1-GPU jobs, 16 of them borrowed; team-a then asks for 8
    # one-GPU jobs within its guarantee at once.
    trace = [TraceJob(f"b{i}", float(i), "team-b", 1, 1, 10 * HOUR, 10 * HOUR) for i in range(32)]
    trace += [TraceJob(f"a{i}", 2000.0 + i, "team-a", 1, 1, HOUR, HOUR) for i in range(8)]
    res = simulate(trace, KUBE, SHARES, policy="borrow", guarantees=HALF,
                   reclaim=Reclaim(max_per_pool_per_minute=3))
    times = [t for t, *_ in res.eviction_log]
    assert len(times) == 8  # every one of team-a's jobs got its GPU in the end
    assert all(sum(1 for u in times if t <= u < t + 60) <= 3 for t in times)
    assert max(times) >= 2000 + 120  # the limit spread them over more than two minutes
    assert not {v for _, _, v, _, _ in res.eviction_log} & {f"b{i}" for i in range(16)}  # the first 16: guaranteed


def test_hard_caps_refuse_a_job_larger_than_its_cap_at_submit():
    trace = [TraceJob("big", 0.0, "team-a", 3, 8, HOUR, HOUR), TraceJob("ok", 0.0, "team-a", 2, 8, HOUR, HOUR)]
    res = simulate(trace, KUBE, SHARES, policy="hard-caps", guarantees=HALF)
    assert outcome(res, "big").refused and outcome(res, "big").start is None
    assert outcome(res, "ok").start == 0.0
    assert res.unstarted_gangs() == res.refused_gangs() == 1


def test_within_guarantee_is_a_property_of_the_trace():
    trace = [TraceJob("x0", 0.0, "team-a", 1, 8, 100, 100), TraceJob("x1", 10.0, "team-a", 1, 8, 100, 100),
             TraceJob("x2", 20.0, "team-a", 1, 8, 100, 100), TraceJob("x3", 200.0, "team-a", 1, 8, 100, 100)]
    assert within_guarantee(trace, {"team-a": 16}) == {"x0", "x1", "x3"}  # x2 arrives with 16 GPUs asked


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_random_traces_run_everything_lose_at_most_a_checkpoint_interval_and_keep_the_rate(seed):
    rng = random.Random(seed)
    pools = [SimPool("slurm", "slurm", 4, 8), SimPool("kube", "kubernetes", 2, 8)]
    trace = []
    for i in range(60):
        w = rng.choice([1, 1, 2])
        run = float(rng.randint(300, 4000))
        trace.append(TraceJob(f"j{i}", float(rng.randint(0, 6000)), rng.choice(["a", "b", "c"]), w,
                              8 if w > 1 else rng.choice([1, 4, 8]), run, run * 1.5))
    trace.sort(key=lambda j: (j.arrival, j.id))
    g = {"a": 24, "b": 16, "c": 8}
    rc = Reclaim(min_runtime_s=400, checkpoint_every_s=900, max_per_pool_per_minute=2)
    res = simulate(trace, pools, {"a": 3, "b": 2, "c": 1}, policy="borrow", guarantees=g, reclaim=rc)
    assert all(o.end is not None for o in res.outcomes)  # everything ran to its end
    for o in res.outcomes:  # a victim never loses more than one checkpoint interval per eviction
        most = o.job.workers * 8  # what an attempt can hold (a whole node on Slurm)
        assert o.lost_gpu_s <= most * 900 * o.evictions
    per_pool: dict[str, list[float]] = {}
    for t, pool, *_ in res.eviction_log:
        per_pool.setdefault(pool, []).append(t)
    assert all(sum(1 for u in ts if t <= u < t + 60) <= 2 for ts in per_pool.values() for t in ts)
