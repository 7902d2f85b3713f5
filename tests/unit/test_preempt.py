"""The one victim-choice rule of reclaim (gateway/domain/preempt.py, issue #30)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.domain.preempt import Room, Running, at_risk_gpu_hours, choose_eviction

NOW = 100_000.0
HOUR = 3600.0


def job(id, *, account="team-b", pool="kube", gpus=8, nodes=0, borrowed=True, ran_s=2 * HOUR, ckpt_ago_s=None):
    return Running(id, account, pool, gpus, nodes, borrowed, NOW - ran_s,
                   None if ckpt_ago_s is None else NOW - ckpt_ago_s)


KUBE = {"kube": Room("kube", False, free_gpus=0, idle_nodes=0)}


def choose(running, pools=KUBE, *, workers=1, gpus_per_worker=8, min_runtime_s=600, **kw):
    return choose_eviction(workers=workers, gpus_per_worker=gpus_per_worker, pools=pools, running=running, now=NOW,
                           min_runtime_s=min_runtime_s, **kw)


def test_at_risk_is_the_work_since_the_last_checkpoint_or_all_of_it_without_a_report():
    assert at_risk_gpu_hours(job("a", gpus=8, ran_s=2 * HOUR), NOW) == 16.0
    assert at_risk_gpu_hours(job("a", gpus=8, ran_s=2 * HOUR, ckpt_ago_s=HOUR / 4), NOW) == 2.0
    # A checkpoint from before this attempt started protects nothing of this attempt.
    assert at_risk_gpu_hours(job("a", gpus=4, ran_s=HOUR, ckpt_ago_s=3 * HOUR), NOW) == 4.0


def test_the_cheapest_borrowed_job_by_work_since_its_checkpoint_is_stopped_and_no_more():
    running = [job("long-no-report", ran_s=3 * HOUR), job("fresh-ckpt", ran_s=5 * HOUR, ckpt_ago_s=600),
               job("mid", ran_s=HOUR)]
    ev = choose(running, preemptor="team-a")
    assert ev is not None and [v.id for v in ev.victims] == ["fresh-ckpt"]
    assert abs(ev.gpu_hours_lost - 8 * 600 / HOUR) < 1e-9
    assert ev.reason == ("to start team-a's gang (8 GPUs) within its guarantee on kube: stops 1 borrowed job of "
                         "team-b: fresh-ckpt (1.3 GPU-hours since its last checkpoint); 1.3 GPU-hours at risk in all")


def test_nothing_within_a_guarantee_is_ever_stopped():
    running = [job("guaranteed", borrowed=False, ran_s=HOUR), job("borrowed", gpus=4, ran_s=5 * HOUR)]
    assert choose(running) is None  # the borrowed job alone frees 4 of the 8 GPUs needed
    ev = choose(running, pools={"kube": Room("kube", False, free_gpus=4, idle_nodes=0)})
    assert [v.id for v in ev.victims] == ["borrowed"]


def test_a_job_younger_than_the_minimum_runtime_is_not_chosen_even_when_cheapest():
    running = [job("young", ran_s=300), job("older", ran_s=HOUR)]
    ev = choose(running, min_runtime_s=600)
    assert [v.id for v in ev.victims] == ["older"]
    assert choose([job("young", ran_s=300)], min_runtime_s=600) is None


def test_never_more_than_needed_a_cheap_victim_made_useless_by_a_bigger_one_is_spared():
    # Cheapest first takes the 2-GPU job, then the 8-GPU one; the 8 alone is enough.
    running = [job("small", gpus=2, ran_s=HOUR), job("big", gpus=8, ran_s=2 * HOUR)]
    ev = choose(running)
    assert [v.id for v in ev.victims] == ["big"]


def test_ties_stop_the_youngest_first_then_by_id():
    running = [job("old", gpus=8, ran_s=2 * HOUR, ckpt_ago_s=HOUR), job("young", gpus=8, ran_s=HOUR)]
    assert [v.id for v in choose(running).victims] == ["young"]
    twins = [job("b", ran_s=HOUR), job("a", ran_s=HOUR)]
    assert [v.id for v in choose(twins).victims] == ["a"]


def test_node_exclusive_pools_count_whole_nodes():
    pools = {"slurm": Room("slurm", True, free_gpus=8, idle_nodes=1)}
    running = [job("one-node", pool="slurm", gpus=8, nodes=1, ran_s=HOUR),
               job("two-nodes", pool="slurm", gpus=16, nodes=2, ran_s=HOUR)]
    ev = choose(running, pools, workers=2)  # needs 2 idle nodes, has 1
    assert [v.id for v in ev.victims] == ["one-node"]
    ev = choose(running, pools, workers=3)
    assert [v.id for v in ev.victims] == ["two-nodes"]


def test_one_set_across_pools_the_one_that_loses_least():
    pools = {"kube": Room("kube", False, 0, 0), "slurm": Room("slurm", True, 0, 0)}
    running = [job("k", pool="kube", gpus=8, ran_s=2 * HOUR),
               job("s", pool="slurm", gpus=8, nodes=1, ran_s=2 * HOUR, ckpt_ago_s=900)]
    ev = choose(running, pools)
    assert ev.pool == "slurm" and [v.id for v in ev.victims] == ["s"]


def test_a_pool_where_the_gang_fits_already_wins_with_nothing_stopped():
    pools = {"kube": Room("kube", False, 0, 0), "roomy": Room("roomy", False, 8, 0)}
    ev = choose([job("k", ran_s=HOUR)], pools)
    assert ev.pool == "roomy" and ev.victims == () and ev.gpu_hours_lost == 0
    assert "without stopping anything" in ev.reason


def test_the_rate_limit_counts_the_last_minute_and_this_set():
    running = [job(f"b{i}", gpus=2, ran_s=HOUR + i) for i in range(4)]  # needs all four
    assert len(choose(running, max_per_pool_per_minute=4).victims) == 4
    assert choose(running, max_per_pool_per_minute=3) is None
    # Evictions in the last 60 s count against the budget; older ones do not.
    assert choose(running, recent={"kube": [NOW - 30]}, max_per_pool_per_minute=4) is None
    assert choose(running, recent={"kube": [NOW - 61, NOW - 90]}, max_per_pool_per_minute=4) is not None


def test_the_rate_limit_sends_the_gang_to_another_pool():
    pools = {"kube": Room("kube", False, 0, 0), "other": Room("other", False, 0, 0)}
    running = [job("cheap", pool="kube", ran_s=HOUR), job("dear", pool="other", ran_s=3 * HOUR)]
    ev = choose(running, pools, recent={"kube": [NOW - 10]}, max_per_pool_per_minute=1)
    assert ev.pool == "other"


# Properties over random snapshots.

def _fits(room: Room, victims, workers: int, gpw: int) -> bool:
    if room.node_exclusive:
        return room.idle_nodes + sum(v.nodes for v in victims) >= workers
    return room.free_gpus + sum(v.gpus for v in victims) >= workers * gpw


@st.composite
def snapshots(draw):
    names = draw(st.lists(st.sampled_from(["p1", "p2", "p3"]), min_size=1, max_size=3, unique=True))
    pools = {}
    for n in names:
        exclusive = draw(st.booleans())
        pools[n] = Room(n, exclusive, free_gpus=draw(st.integers(0, 16)), idle_nodes=draw(st.integers(0, 3)))
    running = []
    for i in range(draw(st.integers(0, 14))):
        pool = draw(st.sampled_from(names + ["elsewhere"]))
        nodes = draw(st.integers(1, 4))
        exclusive = pool in pools and pools[pool].node_exclusive
        gpus = nodes * 8 if exclusive else draw(st.integers(1, 16))
        started = NOW - draw(st.floats(0, 10 * HOUR))
        ckpt = draw(st.one_of(st.none(), st.floats(started - HOUR, NOW)))
        running.append(Running(f"r{i}", draw(st.sampled_from(["b", "c"])), pool, gpus, nodes if exclusive else 0,
                               draw(st.booleans()), started, ckpt))
    workers = draw(st.integers(1, 6))
    return pools, running, workers, draw(st.sampled_from([1, 4, 8])), draw(st.floats(0, 2 * HOUR))


@settings(max_examples=100, deadline=None)
@given(snapshots(), st.integers(1, 6))
def test_properties_of_every_eviction(snap, limit):
    pools, running, workers, gpw, min_runtime = snap
    ev = choose_eviction(workers=workers, gpus_per_worker=gpw, pools=pools, running=running, now=NOW,
                         min_runtime_s=min_runtime, max_per_pool_per_minute=limit)
    if ev is None:  # a pool where the gang fits already is always an answer (nothing to stop)
        assert not any(_fits(room, [], workers, gpw) for room in pools.values())
        return
    room = pools[ev.pool]
    assert all(v.borrowed and v.pool == ev.pool and NOW - v.started_at >= min_runtime for v in ev.victims)
    assert _fits(room, ev.victims, workers, gpw), "the gang fits after the eviction"
    for v in ev.victims:  # minimal: sparing any one victim leaves the gang without room
        assert not _fits(room, [x for x in ev.victims if x is not v], workers, gpw)
    assert len(ev.victims) <= limit
    assert abs(ev.gpu_hours_lost - sum(at_risk_gpu_hours(v, NOW) for v in ev.victims)) < 1e-9


@settings(max_examples=60, deadline=None)
@given(snapshots())
def test_it_is_none_only_when_no_pool_can_be_made_to_fit(snap):
    pools, running, workers, gpw, min_runtime = snap
    ev = choose_eviction(workers=workers, gpus_per_worker=gpw, pools=pools, running=running, now=NOW,
                         min_runtime_s=min_runtime, max_per_pool_per_minute=10_000)
    could = any(_fits(room, [r for r in running if r.pool == name and r.borrowed
                             and NOW - r.started_at >= min_runtime], workers, gpw)
                for name, room in pools.items())
    assert (ev is not None) == could


def test_silence_is_not_protection_a_long_silent_job_costs_no_more_than_a_careful_one():
    """Issue #45: counted with all its run time at risk, a job that never reports looked the
    most expensive to stop and honest reporters went first. It is now taken to checkpoint every
    30 minutes: a reporter whose last checkpoint is older than that goes after it; its reason
    still says what it really loses."""
    running = [job("silent-10h", ran_s=10 * HOUR), job("reported-45min-ago", ran_s=5 * HOUR, ckpt_ago_s=2700)]
    ev = choose(running, preemptor="team-a")
    assert [v.id for v in ev.victims] == ["silent-10h"]
    assert "silent-10h (80.0 GPU-hours since it started)" in ev.reason and abs(ev.gpu_hours_lost - 80) < 1e-9
    # A report newer than the bound is cheaper than silence.
    ev = choose([job("silent-10h", ran_s=10 * HOUR), job("reported-10min-ago", ran_s=5 * HOUR, ckpt_ago_s=600)])
    assert [v.id for v in ev.victims] == ["reported-10min-ago"]
    # A checkpoint of an earlier attempt (older than this attempt's start) is no report at all.
    ev = choose([job("old-report", ran_s=10 * HOUR, ckpt_ago_s=11 * HOUR), job("reported-45min-ago", ran_s=HOUR,
                                                                            ckpt_ago_s=2700)])
    assert [v.id for v in ev.victims] == ["old-report"]
