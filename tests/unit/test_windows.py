"""Maintenance windows in the planner and in a waiting job's words (issue #31, docs/planning.md).

Pure: the planner and the window helpers. tests/dispatch/test_windows_slurm.py runs the same
rules through the gateway against real Slurm clusters (an admin's window and a real MAINT
reservation).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from adapters.base import Capacity, PoolCapacity, Window
from gateway.domain.planner import Candidate, Outage, PoolModel, Release, plan
from gateway.domain.routing import PoolView
from gateway.domain.windows import (
    PlannedWindow,
    crossing_words,
    from_backend,
    limit_words,
    outages,
    units,
    when,
)

SLURM = PoolModel("slurm-a", node_exclusive=True, total_units=4, gpus_per_node=8)
KUBE = PoolModel("kube-a", node_exclusive=False, total_units=32, gpus_per_node=8)
T0 = datetime(2026, 12, 8, 2, 0, tzinfo=UTC)  # a Tuesday


def job(id_, workers, limit, pools=("slurm-a",)):
    return Candidate(id_, workers, 8, limit, pools)


def whole(pool="slurm-a", start=3600.0, end=7200.0, units_=4, in_snapshot=False):
    return Outage(pool, units_, start, end, f"{pool} is in maintenance", in_snapshot)


def test_a_gang_whose_limit_crosses_a_window_waits_until_it_ends():
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], windows=[whole()],
             candidates=[job("long", 2, 8 * 3600)])
    assert not p.starts
    assert (p.reservations[0].job_id, p.reservations[0].start) == ("long", 7200)
    assert p.crossing["long"] == ("slurm-a is in maintenance",)


def test_a_job_short_enough_to_end_before_the_window_backfills():
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], windows=[whole()],
             candidates=[job("long", 2, 8 * 3600), job("short", 4, 3600)])
    assert [s.job_id for s in p.starts] == ["short"]  # ends at 3600, exactly when the window starts
    assert "short" not in p.crossing


def test_one_second_too_long_does_not_backfill():
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], windows=[whole()],
             candidates=[job("short", 1, 3601)])
    assert not p.starts and p.reservations[0].start == 7200


def test_a_window_on_some_nodes_leaves_the_rest_usable():
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], windows=[whole(units_=2)],
             candidates=[job("two", 2, 8 * 3600), job("three", 3, 8 * 3600)])
    assert [s.job_id for s in p.starts] == ["two"]  # the two nodes the window does not take
    # three nodes: not in the window (2 left) and not before "two" ends (8 h)
    assert p.reservations[0].job_id == "three" and p.reservations[0].start == 8 * 3600


def test_an_active_window_takes_the_units_now_and_gives_them_back_at_its_end():
    gateway_window = whole(start=-60, end=600)  # the backend does not know it: the snapshot shows 4 free
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], windows=[gateway_window],
             candidates=[job("g", 4, 60)])
    assert not p.starts and p.reservations[0].start == 600


def test_a_backend_window_active_now_is_not_taken_twice():
    # Slurm's own MAINT reservation on 2 nodes: the snapshot already shows them not idle (2 free).
    w = whole(start=-60, end=600, units_=2, in_snapshot=True)
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 2}, releases=[], windows=[w],
             candidates=[job("two", 2, 60), job("four", 4, 60)])
    assert [s.job_id for s in p.starts] == ["two"]  # the 2 idle nodes are usable
    assert p.reservations[0].job_id == "four" and p.reservations[0].start == 600  # all 4 back at its end


def test_a_running_gang_that_ends_inside_the_window_frees_nothing_until_the_window_ends():
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 0}, releases=[Release("slurm-a", 4, 4000)],
             windows=[whole()], candidates=[job("g", 1, 60)])
    assert p.reservations[0].start == 7200


def test_a_window_on_another_pool_sends_the_gang_elsewhere():
    p = plan(now=0, pools=[SLURM, KUBE], free_now={"slurm-a": 4, "kube-a": 32}, releases=[],
             windows=[whole()], candidates=[job("g", 2, 8 * 3600, pools=("slurm-a", "kube-a"))])
    assert [(s.job_id, s.pool) for s in p.starts] == [("g", "kube-a")]


def test_a_window_with_no_end_means_never_and_says_why():
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[],
             windows=[whole(end=float("inf"))], candidates=[job("g", 1, 8 * 3600)])
    assert "g" in p.unplanned and p.crossing["g"] == ("slurm-a is in maintenance",)


def test_an_ended_window_changes_nothing():
    p = plan(now=10_000, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], windows=[whole()],
             candidates=[job("g", 4, 8 * 3600)])
    assert [s.job_id for s in p.starts] == ["g"] and not p.crossing


# ---------------------------------------------------------------- windows in words and units


def view(name="slurm-24", exclusive=True, windows=()):
    cap = Capacity("slurm", (PoolCapacity(name, 4, 4, 32, 32, gpus_per_node=8, windows=tuple(windows)),))
    return PoolView(name=name, capacity=cap, free_gpus=32, idle_nodes=4, total_gpus=32,
                    total_nodes=4, gpus_per_node=8, kind="slurm" if exclusive else "kubernetes")


def test_the_reason_names_the_pool_the_window_and_the_limit():
    w = PlannedWindow("slurm-24", T0 + timedelta(hours=4), T0 + timedelta(hours=8), reason="kernel upgrade")
    out = outages({"slurm-24": view()}, [w], now=T0)
    assert out[0].words == "slurm-24 is in maintenance from Tue 8 Dec 06:00 to 10:00 UTC (kernel upgrade)"
    assert crossing_words([out[0].words], 8 * 3600) == (
        "slurm-24 is in maintenance from Tue 8 Dec 06:00 to 10:00 UTC (kernel upgrade); "
        "this job's 8 h limit would cross it")


@pytest.mark.parametrize("seconds, words", [(8 * 3600, "8 h"), (5400, "1 h 30 min"), (2700, "45 min"),
                                            (187200, "2 d 4 h"), (30, "30 s")])
def test_limits_in_words(seconds, words):
    assert limit_words(seconds) == words


def test_a_window_across_days_names_both_days():
    assert when(T0, T0 + timedelta(days=1)) == "from Tue 8 Dec 02:00 to Wed 9 Dec 02:00 UTC"


def test_units_follow_the_pool_and_never_exceed_it():
    some = PlannedWindow("slurm-24", T0, T0 + timedelta(hours=1), nodes=("n1", "n2"))
    everything = PlannedWindow("slurm-24", T0, T0 + timedelta(hours=1))
    assert units(some, view()) == 2 and units(everything, view()) == 4
    gpu_pool = view(exclusive=False)
    gpu_pool.kind = "kubernetes"
    assert units(some, gpu_pool) == 16 and units(everything, gpu_pool) == 32
    many = PlannedWindow("slurm-24", T0, T0 + timedelta(hours=1), nodes=tuple(f"n{i}" for i in range(9)))
    assert units(many, view()) == 4


def test_a_backend_window_in_the_snapshot_is_planned_as_already_taken():
    w = Window("maint1", T0, T0 + timedelta(hours=2), ("n1",), True, "Slurm reservation maint1 (MAINT)")
    [planned] = from_backend({"slurm-24": view(windows=[w])})
    assert (planned.pool, planned.nodes, planned.in_snapshot, planned.source) == ("slurm-24", ("n1",), True, "slurm")
    [o] = outages({"slurm-24": view(windows=[w])}, [planned], now=T0)
    assert o.units == 1 and o.in_snapshot
    assert o.words.startswith("1 node of slurm-24 (n1) is in maintenance from Tue 8 Dec 02:00 to 04:00 UTC")


# ---------------------------------------------------------------- the simulator


def test_the_simulator_runs_nothing_across_a_window_and_backfills_before_it():
    """A replay with a whole-pool window: no job's run overlaps it, jobs short enough run
    right up to it, and the rest wait for its end (the planner's rule, round by round)."""
    from gateway.domain.sim_inputs import SimPool, TraceJob
    from gateway.domain.simulate import simulate

    pool = SimPool("slurm-a", "slurm", 4, 8)
    trace = [TraceJob(f"j{i}", arrival=i * 60.0, account="a" if i % 2 else "b", workers=1 + i % 2,
                      gpus_per_worker=8, run_s=900.0 + 300 * (i % 5), time_limit_s=3600.0 * (1 + i % 3),
                      kinds=("slurm",)) for i in range(40)]
    window = Outage("slurm-a", 4, 4 * 3600.0, 6 * 3600.0, "slurm-a is in maintenance")
    res = simulate(trace, [pool], {"a": 1, "b": 1}, outages=[window])
    runs = [(o.start, o.end) for o in res.outcomes]
    assert all(s is not None and e is not None for s, e in runs)  # everything ran in the end
    assert not [r for r in runs if r[0] < window.end and r[1] > window.start]  # nothing ran inside it
    # Each started job's limit ended by the window, or it started after it.
    assert all(o.start + o.job.time_limit_s <= window.start or o.start >= window.end for o in res.outcomes)
    assert any(window.start - 3600 <= o.start + o.job.time_limit_s <= window.start for o in res.outcomes)
    assert min(o.start for o in res.outcomes if o.start >= window.end) == window.end  # a round at its end
    without = simulate(trace, [pool], {"a": 1, "b": 1})
    assert [r for r in ((o.start, o.end) for o in without.outcomes) if r[0] < window.end and r[1] > window.start]


# ---------------------------------------------------------------- holds (advance reservations)

from gateway.domain.planner import Hold  # noqa: E402


def team(id_, account, workers, limit, pools=("slurm-a",)):
    return Candidate(id_, workers, 8, limit, pools, account=account)


def hold(units=2, start=0.0, end=7200.0, in_use=()):
    return Hold("h1", "slurm-a", frozenset({"team-a"}), units, start, end, "2 nodes of slurm-a are reserved for team-a",
                in_use)


def test_others_do_not_take_held_capacity_and_the_owner_does():
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], holds=[hold()],
             candidates=[team("b1", "team-b", 2, 600), team("b2", "team-b", 1, 600), team("a1", "team-a", 2, 600)])
    assert [(s.job_id, s.hold) for s in p.starts] == [("b1", ""), ("a1", "h1")]
    assert p.reservations[0].job_id == "b2" and p.reservations[0].start == 600  # after b1, not in the hold
    assert p.crossing["b2"] == ("2 nodes of slurm-a are reserved for team-a",)


def test_the_owner_uses_its_hold_first_and_only_what_ends_inside_it():
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], holds=[hold()],
             candidates=[team("a1", "team-a", 2, 600), team("a2", "team-a", 2, 600), team("a3", "team-a", 2, 9000)])
    assert [(s.job_id, s.hold) for s in p.starts] == [("a1", "h1"), ("a2", "")]  # the hold first, then the rest
    # a3's limit would run past the hold's end: not in it; the open nodes are a2's until 600
    assert p.reservations[0].job_id == "a3" and p.reservations[0].hold == "" and p.reservations[0].start == 600


def test_a_future_hold_lets_short_work_backfill_and_keeps_long_work_off():
    future = hold(units=4, start=3600, end=7200)
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], holds=[future],
             candidates=[team("long", "team-b", 4, 7200), team("short", "team-b", 4, 3600),
                         team("mine", "team-a", 4, 3600)])
    assert [s.job_id for s in p.starts] == ["short"]
    planned = {r.job_id: (r.start, r.hold) for r in p.reservations}
    assert planned["long"] == (7200, "")  # behind the hold
    assert planned["mine"] == (3600, "h1")  # in its hold, from its start


def test_a_gang_running_in_the_hold_is_counted_there_not_twice():
    # team-a runs 2 nodes in its 2-node hold until 1000; the snapshot shows 2 of 4 nodes free.
    running = hold(in_use=((1000.0, 2),))
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 2}, releases=[Release("slurm-a", 2, 1000.0)],
             holds=[running], candidates=[team("b", "team-b", 2, 600), team("a", "team-a", 2, 600)])
    assert [s.job_id for s in p.starts] == ["b"]  # the 2 open nodes are free for others
    # a: its hold is full until 1000; the open nodes are free again at 600 (b's end): earlier wins
    assert (p.reservations[0].job_id, p.reservations[0].start, p.reservations[0].hold) == ("a", 600, "")
    alone = plan(now=0, pools=[SLURM], free_now={"slurm-a": 2}, releases=[Release("slurm-a", 2, 1000.0)],
                 holds=[running], candidates=[team("a", "team-a", 4, 600)])
    # 4 nodes: a gang runs wholly in a hold or wholly outside it (as a Slurm job in a
    # reservation does), so not 2 held + 2 open: after the hold's end
    assert alone.reservations[0].start == 7200.0
    later = plan(now=0, pools=[SLURM], free_now={"slurm-a": 2}, releases=[Release("slurm-a", 2, 1000.0)],
                 holds=[running], candidates=[team("b", "team-b", 4, 600)])
    assert later.reservations[0].start == 7200  # the hold's nodes come back to others at its end only


def test_the_simulator_honours_a_hold_at_its_start_and_its_account_runs_in_it():
    """A replay with 2 of 4 nodes held for team-a from 2 h to 6 h while team-b keeps the pool busy:
    the held nodes are free at the hold's start, team-a's gangs run in it, and team-b never
    holds more than the other 2 nodes while it lasts."""
    from gateway.domain.sim_inputs import SimPool, TraceJob
    from gateway.domain.simulate import simulate

    pool = SimPool("slurm-a", "slurm", 4, 8)
    trace = [TraceJob(f"b{i}", arrival=i * 300.0, account="team-b", workers=1, gpus_per_worker=8, run_s=1500.0,
                      time_limit_s=1800.0, kinds=("slurm",)) for i in range(80)]
    trace += [TraceJob(f"a{i}", arrival=2 * 3600.0 + i * 1800, account="team-a", workers=2, gpus_per_worker=8,
                       run_s=1200.0, time_limit_s=1800.0, kinds=("slurm",)) for i in range(6)]
    trace.sort(key=lambda j: j.arrival)
    h = Hold("h1", "slurm-a", frozenset({"team-a"}), 2, 2 * 3600.0, 6 * 3600.0, "2 nodes held for team-a")
    res = simulate(trace, [pool], {"team-a": 1, "team-b": 1}, holds=[h])
    assert res.holds_honoured == {"h1": True}
    assert res.hold_used_gpu_s["h1"] >= 6 * 16 * 1200.0 - 1  # all six team-a gangs ran in it
    for t in range(int(h.start), int(h.end), 60):  # team-b on at most the 2 open nodes meanwhile
        running_b = sum(1 for o in res.outcomes if o.job.account == "team-b" and o.start <= t < o.end)
        assert running_b <= 2, t
    unheld = simulate(trace, [pool], {"team-a": 1, "team-b": 1})
    assert max(sum(1 for o in unheld.outcomes if o.job.account == "team-b" and o.start <= t < o.end)
               for t in range(int(h.start), int(h.end), 60)) > 2  # without it, team-b takes more


def test_a_backend_window_on_every_node_of_the_pool_is_named_as_the_pools():
    w = Window("maint2", T0, T0 + timedelta(hours=2), ("n1", "n2", "n3", "n4"), True, "Slurm reservation maint2 (MAINT)")
    [o] = outages({"slurm-24": view(windows=[w])}, from_backend({"slurm-24": view(windows=[w])}), now=T0)
    assert o.words.startswith("slurm-24 is in maintenance from Tue 8 Dec 02:00 to 04:00 UTC") and o.units == 4


def test_a_full_open_pool_does_not_end_the_round_while_a_hold_has_room():
    """Greedy (depth 0): once nothing more can be reserved and the open capacity is full, later
    jobs matter only if they fit now, and an account's job still fits now in its hold."""
    p = plan(now=0, pools=[SLURM], free_now={"slurm-a": 4}, releases=[], holds=[hold()], depth=0,
             candidates=[team("b1", "team-b", 2, 600), team("b2", "team-b", 2, 600), team("a1", "team-a", 2, 600)])
    assert [(s.job_id, s.hold) for s in p.starts] == [("b1", ""), ("a1", "h1")]
